"""`gluejobs keys create|ls|revoke|rotate` and `gluejobs audit`: an admin's commands.

A key's secret is printed once, by the command that made it (create, rotate), with a line on stderr
saying it will not be shown again; `ls` never has it to show.
"""

from __future__ import annotations

import click

from gluejobs.cli.base import Choice, ClientCommand, Group, Invocation, note
from gluejobs.cli.output import table, when
from gluejobs.client import ApiKeyInfo, AuditEntry

ROLES = ("user", "admin", "read-only")
SHOWN_ONCE = "this secret is shown once and will not be shown again: keep it now"
KEY_ID = click.argument("key_id", type=int, metavar="KEY")


@click.group("keys", cls=Group)
def keys() -> None:
    """API keys (admin keys only): create, ls, revoke, rotate."""


@keys.command("create", cls=ClientCommand, json="the key, with its secret")
@click.argument("owner")
@click.option("--role", type=Choice(ROLES), default="user", show_default=True, help="What the key may do.")
@click.option("--name", help="A label to tell keys apart (default: OWNER-key).")
@click.option("--expires-in-days", type=float, metavar="DAYS", help="Stop working after DAYS.")
def create(api: Invocation, owner: str, role: str, name: str | None, expires_in_days: float | None) -> None:
    """Make a key for OWNER; prints its secret once.

    OWNER: who the key acts as, a person or a team."""
    with api.client() as client:
        key = client.keys.create(owner=owner, role=role, name=name, expires_in_days=expires_in_days)
    _made(api, key, f"key {key.id} ({key.name}) for {key.owner}, role {key.role}")


@keys.command("ls", cls=ClientCommand, json="the keys (a list)")
@click.option("--owner", help="Only this owner's keys.")
@click.option("--all", "everything", is_flag=True, help="Revoked keys too.")
def ls(api: Invocation, owner: str | None, everything: bool) -> None:
    """The stored keys (never their secrets).

    Columns: id, name, owner, role, prefix, created, last used, expires, revoked."""
    with api.client() as client:
        found = client.keys.list(owner=owner, include_revoked=everything)
    api.show([key.raw for key in found], _key_table(found) if found else "no keys")


@keys.command("revoke", cls=ClientCommand, json="the revoked key")
@KEY_ID
def revoke(api: Invocation, key_id: int) -> None:
    """Revoke a key: its next request gets 401."""
    with api.client() as client:
        key = client.keys.revoke(key_id)
    api.show(key.raw, f"key {key.id} ({key.name}, {key.owner}) revoked")


@keys.command("rotate", cls=ClientCommand, json="the new key, with its secret")
@KEY_ID
def rotate(api: Invocation, key_id: int) -> None:
    """Replace a key (revoked at once); prints the new secret once."""
    with api.client() as client:
        key = client.keys.rotate(key_id)
    _made(api, key, f"key {key.id} replaces key {key_id} (revoked)")


def _made(api: Invocation, key: ApiKeyInfo, what: str) -> None:
    expiry = f", expires {when(key.expires_at)}" if key.expires_at else ""
    api.show(key.raw, [f"{what}{expiry}", str(key.secret)])
    note(SHOWN_ONCE)


def _key_table(found: list[ApiKeyInfo]) -> list[str]:
    columns = ("id", "name", "owner", "role", "prefix", "created", "last used", "expires", "revoked")
    rows = [
        [
            str(key.id),
            key.name,
            key.owner,
            key.role,
            key.prefix + "…",
            when(key.created_at),
            when(key.last_used_at),
            when(key.expires_at),
            when(key.revoked_at),
        ]
        for key in found
    ]
    return table(columns, rows, right={"id"})


@click.command("audit", cls=ClientCommand, json="the entries (a list)")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many entries.")
def audit(api: Invocation, limit: int) -> None:
    """Who changed keys and quotas, newest first (admin keys only)."""
    entries: list[AuditEntry] = []
    with api.client() as client:
        for entry in client.audit.list(page_size=min(max(limit, 1), 100)):
            entries.append(entry)
            if len(entries) >= limit:
                break
    rows = [
        [str(e.id), when(e.created_at), e.actor or "-", e.action, e.target, _data(e.data)] for e in entries
    ]
    columns = ("id", "when", "actor", "action", "target", "data")
    api.show([e.raw for e in entries], table(columns, rows, right={"id"}) if entries else "no audit entries")


def _data(data: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items() if v is not None)


COMMANDS = (keys, audit)
