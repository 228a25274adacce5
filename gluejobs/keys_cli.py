"""`gluejobs keys create|ls|revoke|rotate` and `gluejobs audit`: an admin's commands.

A key's secret is printed once, by the command that made it (create, rotate), with a line on stderr
saying it will not be shown again; `ls` never has it to show.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gluejobs.client import ApiKeyInfo, AuditEntry, Client
from gluejobs.output import print_json, table

AddClientCommand = Callable[..., argparse.ArgumentParser]
ROLES = ("user", "admin", "read-only")
SHOWN_ONCE = "this secret is shown once and will not be shown again: keep it now"


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    keys = commands.add_parser("keys", help="API keys (admin keys only): create, ls, revoke, rotate")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = client_command(actions, "create", help="make a key for an owner; prints its secret once")
    create.add_argument("owner", help="who the key acts as: a person or a team")
    create.add_argument("--role", choices=ROLES, default="user")
    create.add_argument("--name", help="a label to tell keys apart (default: OWNER-key)")
    create.add_argument("--expires-in-days", type=float, metavar="DAYS", help="stop working after DAYS")
    _json(create, "the key, with its secret")
    ls = client_command(actions, "ls", help="the stored keys (never their secrets)")
    ls.add_argument("--owner", help="only this owner's keys")
    ls.add_argument("--all", action="store_true", help="revoked keys too")
    _json(ls, "the keys")
    revoke = client_command(actions, "revoke", help="revoke a key: its next request gets 401")
    revoke.add_argument("key_id", type=int)
    _json(revoke, "the revoked key")
    rotate = client_command(actions, "rotate", help="a new key in place of one (which is revoked at once)")
    rotate.add_argument("key_id", type=int)
    _json(rotate, "the new key, with its secret")
    audit = client_command(commands, "audit", help="who changed keys and quotas, newest first (admin)")
    audit.add_argument("--limit", type=int, default=50, help="at most this many entries")
    _json(audit, "the entries")


def _json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"{what}: one JSON document")


def run_keys(args: argparse.Namespace, client: Client) -> int:
    if args.keys_command == "ls":
        keys = client.keys.list(owner=args.owner, include_revoked=args.all)
        if args.json:
            print_json([key.raw for key in keys])
        else:
            print("\n".join(_key_table(keys)) if keys else "no keys")
        return 0
    if args.keys_command == "revoke":
        key = client.keys.revoke(args.key_id)
        if args.json:
            print_json(key.raw)
        else:
            print(f"key {key.id} ({key.name}, {key.owner}) revoked")
        return 0
    if args.keys_command == "rotate":
        key = client.keys.rotate(args.key_id)
        return _made(args, key, f"key {key.id} replaces key {args.key_id} (revoked)")
    key = client.keys.create(
        owner=args.owner, role=args.role, name=args.name, expires_in_days=args.expires_in_days
    )
    return _made(args, key, f"key {key.id} ({key.name}) for {key.owner}, role {key.role}")


def _made(args: argparse.Namespace, key: ApiKeyInfo, what: str) -> int:
    if args.json:
        print_json(key.raw)
    else:
        expiry = f", expires {key.expires_at.isoformat(timespec='seconds')}" if key.expires_at else ""
        print(f"{what}{expiry}")
        print(key.secret)
    print(SHOWN_ONCE, file=sys.stderr)
    return 0


def _key_table(keys: list[ApiKeyInfo]) -> list[str]:
    columns = ("id", "name", "owner", "role", "prefix", "created", "last used", "expires", "revoked")
    rows = [
        [
            str(key.id),
            key.name,
            key.owner,
            key.role,
            key.prefix + "…",
            _when(key.created_at),
            _when(key.last_used_at),
            _when(key.expires_at),
            _when(key.revoked_at),
        ]
        for key in keys
    ]
    return table(columns, rows, right={"id"})


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "-"


def run_audit(args: argparse.Namespace, client: Client) -> int:
    entries: list[AuditEntry] = []
    for entry in client.audit.list(page_size=min(max(args.limit, 1), 100)):
        entries.append(entry)
        if len(entries) >= args.limit:
            break
    if args.json:
        print_json([entry.raw for entry in entries])
        return 0
    if not entries:
        print("no audit entries")
        return 0
    rows = [
        [str(e.id), _when(e.created_at), e.actor or "-", e.action, e.target, _data(e.data)] for e in entries
    ]
    print("\n".join(table(("id", "when", "actor", "action", "target", "data"), rows, right={"id"})))
    return 0


def _data(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items() if v is not None)
