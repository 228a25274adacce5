"""service/edge/connections.py overrides non-public parts of uvicorn's h11 protocol: the server's
requirement pins the releases it was written against, the installed one is among them and has every
hook, and a uvicorn without one stops the API at import with the version and the hook named."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from service.edge.connections import UVICORN_REQUIREMENT, UnsupportedUvicorn, check_uvicorn_hooks
from tests.support.kit import REPO


def test_the_server_pins_the_uvicorn_releases_the_protocol_was_written_against() -> None:
    dependencies = tomllib.loads((REPO / "server" / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn"]
    assert [str(r) for r in pinned] == [str(Requirement(UVICORN_REQUIREMENT))]
    upper = [spec for spec in pinned[0].specifier if spec.operator == "<"]
    assert upper, "an upper bound: the next uvicorn may move the hooks"
    assert pinned[0].specifier.contains(version("uvicorn"))
    check_uvicorn_hooks()  # the installed one has every hook


def test_a_uvicorn_without_a_hook_fails_loudly_naming_its_version_and_the_hook() -> None:
    class Renamed(H11Protocol):  # a release that renamed the hook run after each response
        on_response_complete = None  # type: ignore[assignment]

    with pytest.raises(
        UnsupportedUvicorn, match=r"uvicorn 9\.9\.9 is installed.*method on_response_complete"
    ):
        check_uvicorn_hooks(Renamed, installed="9.9.9")

    class Cycle(RequestResponseCycle):
        def __init__(self) -> None:  # a release whose cycle no longer keeps response_complete
            self.done = False

    with pytest.raises(UnsupportedUvicorn, match=r"cycle\.response_complete.*uvicorn>=0\.30,<0\.56"):
        check_uvicorn_hooks(H11Protocol, Cycle, installed="9.9.9")
