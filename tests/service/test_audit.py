"""The audit log's writes and cursor pages, on both databases."""

from __future__ import annotations

from service.accounts import audit
from shared.core.db import Database, write


def test_entries_commit_with_their_change_and_page_newest_first(db: Database) -> None:
    with db.session() as session, write(session):
        audit.record(session, actor="alice", action="key.create", target="key 1", data={"role": "user"})
        audit.record(session, actor=None, action="quota.set", target="owner bob", data={"max_devices": 2})
    with db.session() as session:
        first, more = audit.list_entries(session, after=None, limit=1)
        assert more
        assert [(e.actor, e.action, e.target, e.data) for e in first] == [
            (None, "quota.set", "owner bob", {"max_devices": 2})
        ]
        rest, more = audit.list_entries(session, after=first[0].id, limit=10)
        assert not more
        assert [(e.actor, e.action, e.data) for e in rest] == [("alice", "key.create", {"role": "user"})]


def test_an_entry_is_not_kept_when_its_transaction_fails(db: Database) -> None:
    with db.session() as session:
        try:
            with write(session):
                audit.record(session, actor="alice", action="key.revoke", target="key 9")
                raise RuntimeError("the change itself failed")
        except RuntimeError:
            pass
        assert audit.list_entries(session, after=None, limit=10) == ([], False)
