"""`gluejobs owners ls|set`: the queue by owner, and (admin keys) an owner's share and quotas."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gluejobs.client import Client, OwnerInfo
from gluejobs.output import print_json

AddClientCommand = Callable[..., argparse.ArgumentParser]
# The flag, and the field of PATCH /v1/owners/{name} it sets; "default" as a value sends null.
SETTINGS = (
    ("--share", "share", float),
    ("--max-devices", "max_devices", int),
    ("--max-queued", "max_queued", int),
    ("--max-device-hours-per-day", "max_device_hours_per_day", float),
)


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    owners = commands.add_parser("owners", help="the queue by owner; an owner's share and quotas")
    actions = owners.add_subparsers(dest="owners_command", required=True)
    ls = client_command(actions, "ls", help="each owner: devices in use, queued jobs, device-hours, quota")
    ls.add_argument("--json", action="store_true", help="the owners as one JSON list")
    change = client_command(actions, "set", help="set an owner's share and quotas (admin key)")
    change.add_argument("name")
    for flag, _field, kind in SETTINGS:
        change.add_argument(flag, type=_value(kind), help=f"a number, or 'default' ({kind.__name__})")
    change.add_argument("--json", action="store_true", help="the owner as the API returns it")


def run_owners(args: argparse.Namespace, client: Client) -> int:
    if args.owners_command == "ls":
        owners = client.owners.list()
        if args.json:
            print_json([owner.raw for owner in owners])
        else:
            print("\n".join(_line(owner) for owner in owners) if owners else "no owners")
        return 0
    changes = {
        field: getattr(args, field) for _flag, field, _kind in SETTINGS if getattr(args, field) is not None
    }
    changes = {field: None if value == "default" else value for field, value in changes.items()}
    if not changes:
        args.command_parser.error("give at least one of " + ", ".join(flag for flag, *_ in SETTINGS))
    owner = client.owners.update(args.name, **changes)
    if args.json:
        print_json(owner.raw)
    else:
        print(_line(owner))
    return 0


def _value(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if text == "default":
            return "default"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'default')") from None
        return value

    parse.__name__ = kind.__name__  # argparse names it in its error
    return parse


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
        f"max_device_hours_per_day {limit('max_device_hours_per_day', ' h')}"
    )
