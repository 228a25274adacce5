"""`gluejobs owners ls|set`: the queue by owner, and (admin keys) an owner's share and quotas."""

from __future__ import annotations

from typing import Any

import click

from gluejobs.cli.base import ClientCommand, Group, Invocation
from gluejobs.cli.output import human_bytes
from gluejobs.client import OwnerInfo


class NumberOrDefault(click.ParamType):
    """A number of `kind`, or "default": back to the configured default (sent as null)."""

    def __init__(self, kind: type[int] | type[float]) -> None:
        self.kind = kind
        self.name = kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "default" or isinstance(value, self.kind):
            return value
        try:
            return self.kind(value)
        except ValueError:
            self.fail(f"{value!r} is not a number (or 'default')", param, ctx)


# The flag, and the field of PATCH /v1/owners/{name} it sets.
SETTINGS = (
    ("--share", "share", float, "Its weight in the fair share of devices (1 by default)."),
    ("--max-devices", "max_devices", int, "Devices its running jobs may hold at once."),
    ("--max-queued", "max_queued", int, "Jobs it may have queued at once."),
    ("--max-device-hours-per-day", "max_device_hours_per_day", float, "Device-hours in any 24 hours."),
    ("--max-storage-bytes", "max_storage_bytes", int, "Bytes it may hold in the store."),
)


@click.group("owners", cls=Group)
def owners() -> None:
    """The queue by owner; an owner's share and quotas: ls, set."""


@owners.command("ls", cls=ClientCommand, json="the owners (a list)")
def ls(api: Invocation) -> None:
    """Each owner's use of the queue, and its quotas.

    Share, running jobs and devices in use, queued jobs, device-hours over the last 24 hours, bytes
    held in the store, and quotas. An admin key sees every owner, another key its own."""
    with api.client() as client:
        found = client.owners.list()
    api.show([owner.raw for owner in found], [_line(owner) for owner in found] or "no owners")


def _settings(function: Any) -> Any:
    for flag, _field, kind, what in reversed(SETTINGS):
        function = click.option(
            flag, type=NumberOrDefault(kind), help=f"{what} A number, or 'default' for the configured one."
        )(function)
    return function


@owners.command("set", cls=ClientCommand, json="the owner")
@click.argument("name")
@_settings
def set_(api: Invocation, name: str, **settings: Any) -> None:
    """Set an owner's share and quotas (admin keys only).

    Give at least one of the options."""
    changes = {field: value for field, value in settings.items() if value is not None}
    if not changes:
        click.get_current_context().fail("give at least one of " + ", ".join(flag for flag, *_ in SETTINGS))
    with api.client() as client:
        owner = client.owners.update(name, **{k: None if v == "default" else v for k, v in changes.items()})
    api.show(owner.raw, _line(owner))


def _line(owner: OwnerInfo) -> str:
    quota, source = owner.quota, owner.quota_source

    def limit(name: str, unit: str = "") -> str:
        value = quota.get(name)
        shown = "no limit" if value is None else f"{value:g}{unit}"
        return shown + (" (default)" if source.get(name) == "default" and value is not None else "")

    return (
        f"{owner.name}  share {owner.share:g}  running {owner.running_jobs} on {owner.devices_in_use} "
        f"device(s)  queued {owner.queued_jobs}  {owner.device_hours_24h:.2f} device-h/24h  "
        f"max_devices {limit('max_devices')}  max_queued {limit('max_queued')}  "
        f"max_device_hours_per_day {limit('max_device_hours_per_day', ' h')}  "
        f"stores {human_bytes(owner.storage.get('total_bytes', 0))} "
        f"(max_storage_bytes {_storage_limit(owner)})"
    )


def _storage_limit(owner: OwnerInfo) -> str:
    value = owner.quota.get("max_storage_bytes")
    shown = "no limit" if value is None else human_bytes(value)
    default = owner.quota_source.get("max_storage_bytes") == "default" and value is not None
    return shown + (" (default)" if default else "")


COMMANDS = (owners,)
