"""The settings' groups (shared/core/config.py): every setting in exactly one group by who reads it, and
the configuration page showing each in its group's section, so that an operator reading about the
workers finds every setting a worker reads there."""

from __future__ import annotations

import re
from pathlib import Path

from shared.core.config import SETTING_GROUPS, Settings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operators" / "configuration.md"


def test_every_setting_is_in_exactly_one_group() -> None:
    seen: dict[str, str] = {}
    for group in SETTING_GROUPS:
        for name in group.model_fields:
            assert name not in seen, f"{name} is in both {seen[name]} and {group.__name__}"
            seen[name] = group.__name__
    assert set(seen) == set(Settings.model_fields), set(Settings.model_fields) ^ set(seen)
    # Settings is the groups composed, nothing of its own: a new field belongs in a group.
    assert {base for base in Settings.__bases__} == set(SETTING_GROUPS)


def test_the_groups_keep_the_environment_names() -> None:
    """Flat mixins, not nested models: each setting is still read from GLUEJOBS_<NAME>."""
    for group in SETTING_GROUPS:
        assert group.model_config.get("env_prefix") == "GLUEJOBS_", group.__name__
        assert group.model_config.get("env_nested_delimiter") is None, group.__name__


def test_the_configuration_page_shows_each_setting_in_its_groups_section() -> None:
    sections = PAGE.read_text().split("\n## ")[1:]
    by_group: dict[str, set[str]] = {}
    for section in sections:
        owner = re.search(r"^`(\w+Settings)`:", section, re.MULTILINE)
        assert owner, f"the section {section.splitlines()[0]!r} does not name its group (`…Settings`:)"
        rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `GLUEJOBS_")]
        by_group[owner[1]] = {name.lower() for row in rows for name in re.findall(r"`GLUEJOBS_(\w+)`", row)}
    assert list(by_group) == [group.__name__ for group in SETTING_GROUPS]
    for group in SETTING_GROUPS:
        documented = by_group[group.__name__]
        assert documented == set(group.model_fields), (
            f"{group.__name__}'s section of {PAGE.name}: missing {set(group.model_fields) - documented}, "
            f"not of this group {documented - set(group.model_fields)}"
        )
