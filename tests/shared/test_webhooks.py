"""Webhooks through real HTTP on SQLite and Postgres: registration and its address rules, ownership,
secrets shown once, Standard Webhooks signatures verified with the `standardwebhooks` library by a
real receiver on 127.0.0.1 (under the allow-list), retries with backoff, a delivery that refuses a
name resolving to loopback, deliveries that survive an API restart (real processes), and the events
of a real job run by a real worker."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main as cli
from gluejobs_server import stack
from shared.core.config import Settings
from shared.core.db import Database, write
from shared.core.tables import utcnow
from shared.webhooks import endpoints, search_finished
from shared.webhooks.addresses import AllowList, RefusedTarget, Target, address_rule, check_addresses
from shared.webhooks.deliveries import claim_due
from tests.support.e2e import live_api, run_worker_until_idle, start_api, wait_for
from tests.support.kit import SPEC, auth
from tests.support.webhook_receiver import receiver, reserved_port

ALICE = "alice=alice-key-0123456789abcdef"
BOB = "bob=bob-key-0123456789abcdef"
ROOT = "root=root-key-0123456789abcdef"
FAST = {"webhook_backoff_s": 0.05, "webhook_backoff_max_s": 0.2, "webhook_poll_s": 0.1}


def create(api: httpx.Client, url: str, key: str | None = None, **body: Any) -> httpx.Response:
    payload = {"url": url, "event_types": ["job.succeeded"], **body}
    return api.post("/v1/webhooks", json=payload, headers=auth(key) if key else {})


def deliveries(api: httpx.Client, endpoint_id: int, key: str | None = None) -> list[dict[str, Any]]:
    answer = api.get(f"/v1/webhooks/{endpoint_id}/deliveries", headers=auth(key) if key else {})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def finished(
    api: httpx.Client, endpoint_id: int, count: int = 1, key: str | None = None
) -> list[dict[str, Any]]:
    """The endpoint's deliveries once `count` of them have finished (delivered or failed)."""

    def done() -> list[dict[str, Any]] | None:
        rows = deliveries(api, endpoint_id, key)
        return rows if sum(r["status"] != "pending" for r in rows) >= count else None

    result: list[dict[str, Any]] = wait_for(done, timeout_s=60, interval_s=0.1)
    return result


def verified(secret: str, request: Any) -> dict[str, Any]:
    """The body, once its signature verifies with the Standard Webhooks library."""
    body: dict[str, Any] = Webhook(secret).verify(request.body, request.headers)
    return body


# --- the address rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.7", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not globally routable"),
        ("198.18.0.1", "private"),
        ("192.0.2.1", "private"),
        ("fc00::1", "private"),
        ("2001:db8::1", "private"),
        ("ff02::1", "multicast"),
        ("::", "unspecified"),
        ("fec0::1", "site-local"),  # deprecated site-local: 3.11's is_global lets it through
        ("3fff::1", "documentation"),  # RFC 9637 (2024): newer than 3.11's tables, which call it global
        ("64:ff9b:1::1", "reserved"),  # NAT64 for local use (RFC 8215)
        # IPv6 transition forms: the IPv4 address they carry decides (issue 32).
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
        ("2002:a9fe:a9fe::", "link-local"),  # 6to4 of 169.254.169.254
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::127.0.0.1", "loopback"),  # IPv4-compatible (deprecated)
        ("::8.8.8.8", "reserved"),  # IPv4-compatible of a public address: ::/8 itself is reserved
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1
        (
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
            "private",
        ),  # Teredo, client 8.8.8.8: 2001::/32 is not global
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
        ("::ffff:93.184.216.34", None),  # the IPv4 address itself, through the kernel
        ("64:ff9b::5db8:d822", None),  # NAT64 of 93.184.216.34, through a NAT64 gateway
    ],
)
def test_address_rules(address: str, rule: str | None) -> None:
    assert address_rule(ipaddress.ip_address(address)) == rule


def test_a_transition_form_is_named_with_the_address_it_carries() -> None:
    for url, words in [
        ("http://[2002:7f00:1::]/", "2002:7f00:1:: is a loopback address (the 6to4 form of 127.0.0.1)"),
        ("http://[fec0::1]/", "fec0::1 is a site-local address: webhooks are sent only to globally routable"),
        ("http://[64:ff9b::a00:1]/", "a private address (the NAT64 form of 10.0.0.1)"),
    ]:
        target = Target.parse(url)
        with pytest.raises(RefusedTarget, match=re.escape(words)):
            check_addresses(target, [ipaddress.ip_address(target.host)], AllowList())
    # An allowed IPv4 network allows the same address written IPv4-mapped (dual-stack resolvers).
    mapped = ipaddress.ip_address("::ffff:127.0.0.1")
    assert check_addresses(Target.parse("http://h/"), [mapped], AllowList.parse(["127.0.0.1"])) == [mapped]


def test_every_resolved_address_is_checked_and_the_allow_list_names_hosts_or_networks() -> None:
    # Only values: nothing is sent to these addresses.
    public, private = ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.5")
    target = Target.parse("https://hooks.example.org/in")
    assert check_addresses(target, [public], AllowList()) == [public]
    with pytest.raises(RefusedTarget, match=r"'hooks.example.org' resolves to 10.0.0.5, a private address"):
        check_addresses(target, [public, private], AllowList())  # one bad address is enough (rebinding)
    assert check_addresses(target, [private], AllowList.parse(["hooks.example.org"])) == [private]
    assert check_addresses(target, [private], AllowList.parse(["10.0.0.0/8"])) == [private]
    with pytest.raises(RefusedTarget, match="link-local"):
        check_addresses(target, [ipaddress.ip_address("169.254.169.254")], AllowList.parse(["10.0.0.0/8"]))
    for url, words in [
        ("ftp://example.org/", "http:// or https://"),
        ("https://user:pw@example.org/", "user name or password"),
        ("http:///nohost", "no host"),
    ]:
        with pytest.raises(RefusedTarget, match=words):
            Target.parse(url)


# --- registration, ownership, secrets -----------------------------------------------------------------


@pytest.fixture
def keyed(settings_factory, db_url: str) -> Settings:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(db_url, api_keys=[ALICE, BOB], admin_keys=[ROOT])
    return settings


@pytest.fixture
def api(keyed: Settings) -> Iterator[httpx.Client]:
    with live_api(keyed) as client:
        yield client


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_private_addresses_are_refused_at_registration_without_the_allow_list(api: httpx.Client) -> None:
    for url, rule in [
        ("http://127.0.0.1:9/hook", "127.0.0.1 is a loopback address"),
        ("http://localhost:9/hook", "'localhost' resolves to 127.0.0.1, a loopback address"),
        ("http://[::1]:9/hook", "::1 is a loopback address"),
        ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("http://[2002:7f00:1::]/", "2002:7f00:1:: is a loopback address (the 6to4 form of 127.0.0.1)"),
        ("http://[fec0::1]/", "fec0::1 is a site-local address"),
        (
            "http://[::ffff:7f00:1]:9/",
            "::ffff:7f00:1 is a loopback address (the IPv4-mapped form of 127.0.0.1)",
        ),
        ("ftp://example.org/", "must start with http:// or https://"),
    ]:
        answer = create(api, url, ALICE)
        assert answer.status_code == 422, (url, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "url" and rule in error["message"], error
        assert "GLUEJOBS_WEBHOOK_ALLOWED_HOSTS" in error["message"] or "http://" in error["message"]
    assert api.get("/v1/webhooks", headers=auth(ALICE)).json()["data"] == []  # nothing stored
    answer = api.post(
        "/v1/webhooks", json={"url": "http://x.org/", "event_types": ["job.done"]}, headers=auth(ALICE)
    )
    assert answer.status_code == 422 and "event_types" in answer.text


def test_endpoints_are_their_owners_and_the_secret_is_shown_once(
    keyed: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = keyed.model_copy(update={"webhook_allowed_hosts": ["127.0.0.1"]})
    with receiver() as hook, live_api(settings) as api:
        made = create(
            api, f"{hook.url}/alice", ALICE, event_types=["job.failed", "job.failed", "sweep.finished"]
        )
        assert made.status_code == 201, made.text
        endpoint = made.json()
        secret, endpoint_id = endpoint["secret"], endpoint["id"]
        assert secret.startswith("whsec_") and endpoint["owner"] == "alice"
        assert endpoint["event_types"] == ["job.failed", "sweep.finished"]

        shown = api.get(f"/v1/webhooks/{endpoint_id}", headers=auth(ALICE))
        listed = api.get("/v1/webhooks", headers=auth(ALICE))
        assert shown.status_code == 200 and "secret" not in shown.json()
        assert [e["id"] for e in listed.json()["data"]] == [endpoint_id]
        assert secret not in shown.text + listed.text

        # Bob neither sees nor touches it; the admin sees it.
        assert api.get("/v1/webhooks", headers=auth(BOB)).json()["data"] == []
        for method, path, body in [
            ("GET", "", None),
            ("PATCH", "", {"disabled": True}),
            ("POST", "/rotate", None),
            ("POST", "/test", None),
            ("GET", "/deliveries", None),
            ("DELETE", "", None),
        ]:
            answer = api.request(method, f"/v1/webhooks/{endpoint_id}{path}", json=body, headers=auth(BOB))
            assert answer.status_code == 404, (method, path, answer.text)
        assert [e["id"] for e in api.get("/v1/webhooks", headers=auth(ROOT)).json()["data"]] == [endpoint_id]

        # PATCH: events, disable (a test-send is then refused), enable; rotate: a new secret.
        patched = api.patch(
            f"/v1/webhooks/{endpoint_id}",
            json={"event_types": ["job.succeeded"], "disabled": True},
            headers=auth(ALICE),
        )
        assert patched.status_code == 200 and patched.json()["disabled"] is True
        assert patched.json()["event_types"] == ["job.succeeded"]
        assert api.post(f"/v1/webhooks/{endpoint_id}/test", headers=auth(ALICE)).status_code == 409
        refused = api.patch(
            f"/v1/webhooks/{endpoint_id}", json={"url": "http://10.0.0.1/"}, headers=auth(ALICE)
        )
        assert refused.status_code == 422 and "private" in refused.text
        assert (
            api.patch(
                f"/v1/webhooks/{endpoint_id}", json={"disabled": False}, headers=auth(ALICE)
            ).status_code
            == 200
        )
        rotated = api.post(f"/v1/webhooks/{endpoint_id}/rotate", headers=auth(ALICE)).json()
        assert rotated["secret"].startswith("whsec_") and rotated["secret"] != secret

        # The test event is signed with the new secret; neither secret is in a log or a delivery.
        sent = api.post(f"/v1/webhooks/{endpoint_id}/test", headers=auth(ALICE))
        assert sent.status_code == 202 and sent.json()["event_type"] == "webhook.test"
        rows = finished(api, endpoint_id, key=ALICE)
        assert rows[0]["status"] == "delivered"
        assert verified(rotated["secret"], hook.requests[0])["type"] == "webhook.test"
        with pytest.raises(Exception, match="signature"):
            Webhook(secret).verify(hook.requests[0].body, hook.requests[0].headers)
        log_text = caplog.text + json.dumps(rows)
        assert secret not in log_text and rotated["secret"] not in log_text

        assert api.delete(f"/v1/webhooks/{endpoint_id}", headers=auth(ALICE)).status_code == 200
        assert api.get(f"/v1/webhooks/{endpoint_id}", headers=auth(ALICE)).status_code == 404


# --- delivery ---------------------------------------------------------------------------------------


def test_a_receiver_that_fails_twice_gets_three_signed_attempts(settings_factory, db_url: str) -> None:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(db_url, webhook_allowed_hosts=["127.0.0.1"], **FAST)
    with receiver(answers=[500, 503]) as hook, live_api(settings) as api:
        endpoint = create(api, f"{hook.url}/in?team=ml").json()
        api.post(f"/v1/webhooks/{endpoint['id']}/test")
        [delivery] = finished(api, endpoint["id"])

    assert delivery["status"] == "delivered" and delivery["attempts"] == 3
    assert [a["status_code"] for a in delivery["attempt_log"]] == [500, 503, 204]
    assert [a["error"] for a in delivery["attempt_log"]] == ["HTTP 500", "HTTP 503", None]
    assert [r.path for r in hook.requests] == ["/in?team=ml"] * 3
    # One message id on every attempt (receivers dedupe on it); each attempt signed afresh.
    assert {r.headers["webhook-id"] for r in hook.requests} == {delivery["message_id"]}
    bodies = [verified(endpoint["secret"], r) for r in hook.requests]
    assert bodies[0] == delivery["payload"] and bodies[0]["data"]["endpoint_id"] == endpoint["id"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_delivery_refuses_a_name_that_now_resolves_to_loopback(settings: Settings) -> None:
    """A name that passed at registration (as if it had resolved to a public address then) and resolves
    to loopback at delivery: refused before any connection, and the log says why."""
    settings = settings.model_copy(update={"webhook_max_attempts": 1, **FAST})
    db = Database(settings.database_url)
    with receiver() as hook, live_api(settings) as api:
        with db.session() as session:
            endpoint = endpoints.create_endpoint(
                session, owner=None, url=f"http://localhost:{hook.port}/", event_types=["job.failed"]
            )
        assert api.post(f"/v1/webhooks/{endpoint.id}/test").status_code == 202
        [delivery] = finished(api, endpoint.id)
    db.dispose()

    assert delivery["status"] == "failed"
    [attempt] = delivery["attempt_log"]
    assert attempt["status_code"] is None
    assert attempt["error"].startswith("refused: 'localhost' resolves to 127.0.0.1, a loopback address")
    assert hook.requests == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_allowed_name_is_sent_to_its_checked_address_with_its_own_host_header(settings: Settings) -> None:
    settings = settings.model_copy(update={"webhook_allowed_hosts": ["localhost"], **FAST})
    with receiver() as hook, live_api(settings) as api:
        endpoint = create(api, f"http://localhost:{hook.port}/named").json()
        assert api.post(f"/v1/webhooks/{endpoint['id']}/test").status_code == 202
        [delivery] = finished(api, endpoint["id"])

    assert delivery["status"] == "delivered"
    [request] = hook.requests
    assert request.headers["host"] == f"localhost:{hook.port}" and request.path == "/named"
    assert verified(endpoint["secret"], request)["type"] == "webhook.test"


def test_concurrent_dispatchers_claim_disjoint_deliveries(db: Database) -> None:
    """Several API processes' dispatchers claiming at once never take the same delivery (Postgres:
    FOR UPDATE SKIP LOCKED; SQLite: one writer), and between them take every due one."""
    with db.session() as session:
        endpoint = endpoints.create_endpoint(
            session, owner="a", url="http://x.org/", event_types=["job.failed"]
        )
        for _ in range(24):
            endpoints.send_test(session, endpoint_id=endpoint.id)

    def claim() -> list[int]:
        with db.session() as session:
            return [d.delivery_id for d in claim_due(session, limit=8, lease_s=30)]

    with ThreadPoolExecutor(4) as pool:
        claims = list(pool.map(lambda _: claim(), range(4)))
    taken = [delivery for claimed in claims for delivery in claimed]
    assert len(taken) == len(set(taken)) == 24


def test_search_finished_is_announced_once(db: Database) -> None:
    with db.session() as session:
        endpoint = endpoints.create_endpoint(
            session, owner="a", url="http://x.org/", event_types=["search.finished"]
        )
        with write(session):
            assert search_finished(session, owner="a", search_id=4, data={"status": "succeeded"}) == 1
            assert search_finished(session, owner="a", search_id=4, data={"status": "succeeded"}) == 0
            assert search_finished(session, owner="b", search_id=5, data={"status": "succeeded"}) == 0
        [delivery] = endpoints.list_deliveries(session, endpoint_id=endpoint.id)[0]
    assert delivery.payload["data"] == {"search_id": 4, "status": "succeeded"}


def test_a_claimed_delivery_is_not_claimed_again_until_its_lease_expires(db: Database) -> None:
    with db.session() as session:
        endpoint = endpoints.create_endpoint(
            session, owner="a", url="http://x.org/", event_types=["job.failed"]
        )
        endpoints.send_test(session, endpoint_id=endpoint.id)
        endpoints.send_test(session, endpoint_id=endpoint.id)
        first = claim_due(session, limit=10, lease_s=30)
        assert len(first) == 2 and claim_due(session, limit=10, lease_s=30) == []
        later = first[0].lease_token  # a process that stopped: its lease expires, another takes them
        again = claim_due(session, limit=10, lease_s=30, now=utcnow() + timedelta(seconds=31))
        assert sorted(d.delivery_id for d in again) == sorted(d.delivery_id for d in first)
        assert {d.lease_token for d in again} != {later}


def test_cancelling_a_sweep_sends_each_job_and_the_sweep_once(settings: Settings) -> None:
    settings = settings.model_copy(update={"webhook_allowed_hosts": ["127.0.0.1"], **FAST})
    with receiver() as hook, live_api(settings) as api:
        endpoint = create(api, hook.url, event_types=["job.cancelled", "sweep.finished"]).json()
        sweep = api.post("/v1/sweeps", json={"spec": SPEC, "seeds": [1, 2, 3]})
        assert sweep.status_code == 201, sweep.text
        assert api.post(f"/v1/sweeps/{sweep.json()['id']}/cancel").status_code in (200, 202)
        rows = finished(api, endpoint["id"], count=4)

    assert sorted(r["event_type"] for r in rows) == ["job.cancelled"] * 3 + ["sweep.finished"]
    [ended] = [r["payload"]["data"] for r in rows if r["event_type"] == "sweep.finished"]
    assert ended["status"] == "cancelled" and ended["job_ids"] == sweep.json()["job_ids"]
    assert len(hook.requests) == 4


# --- restarts and a real job --------------------------------------------------------------------------


# Postgres, the database of a fleet of API processes; delivery claims and leases on both databases
# are the tests above.
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.e2e
def test_deliveries_survive_an_api_restart(settings: Settings, tmp_path: Path) -> None:
    """The receiver is down while the first API tries; that API stops; the next one delivers."""
    settings = settings.model_copy(
        update={"webhook_allowed_hosts": ["127.0.0.1"], **FAST, "webhook_backoff_s": 1.0}
    )
    env = stack.stack_environment(settings)
    hook_socket = reserved_port()
    hook_port = hook_socket.getsockname()[1]
    log = tmp_path / "api.log"
    api, url = start_api(env, log=log)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            endpoint = create(client, f"http://127.0.0.1:{hook_port}/").json()
            client.post(f"/v1/webhooks/{endpoint['id']}/test")
            wait_for(lambda: deliveries(client, endpoint["id"])[0]["attempts"] >= 1, timeout_s=30)
    finally:
        stack.stop(api)
    with receiver(bound=hook_socket) as hook:
        api, url = start_api(env, log=log)
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                [delivery] = finished(client, endpoint["id"])
        finally:
            stack.stop(api)

    assert delivery["status"] == "delivered", delivery
    assert (
        delivery["attempt_log"][0]["status_code"] is None and "Connect" in delivery["attempt_log"][0]["error"]
    )
    assert delivery["attempt_log"][-1]["status_code"] == 204
    assert (
        len(hook.requests) == 1 and verified(endpoint["secret"], hook.requests[0])["type"] == "webhook.test"
    )


# One database: the events come from the worker's reports, whose rows both databases store alike
# (tests above); this one adds the real job and receiver.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.e2e
def test_a_real_job_sends_signed_job_checkpoint_and_sweep_events(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"webhook_allowed_hosts": ["127.0.0.1"], **FAST})
    small = {
        **SPEC,
        "max_train_samples": 16,
        "max_eval_samples": 16,
        "per_device_train_batch_size": 8,
        "num_train_epochs": 1,
        "learning_rate": 1e-3,
    }
    with receiver() as hook, live_api(settings) as api:
        events = ["job.succeeded", "job.failed", "checkpoint.declared", "sweep.finished"]
        endpoint = create(api, f"{hook.url}/gluejobs", event_types=events).json()
        sweep = api.post("/v1/sweeps", json={"spec": small, "seeds": [5]})
        assert sweep.status_code == 201, sweep.text
        run_worker_until_idle(settings, tmp_path / "worker.log")
        rows = finished(api, endpoint["id"], count=3)
        job = api.get(f"/v1/jobs/{sweep.json()['job_ids'][0]}").json()

    assert job["status"] == "succeeded"
    bodies = {body["type"]: body for body in (verified(endpoint["secret"], r) for r in hook.requests)}
    assert sorted(bodies) == ["checkpoint.declared", "job.succeeded", "sweep.finished"]
    assert {r["status"] for r in rows} == {"delivered"}
    succeeded = bodies["job.succeeded"]["data"]
    assert succeeded["job_id"] == job["id"] and succeeded["status"] == "succeeded"
    assert succeeded["sweep_id"] == sweep.json()["id"] and succeeded["task_name"] == "sst2"
    assert succeeded["best_metrics"]["metric"] == "accuracy"
    assert bodies["checkpoint.declared"]["data"]["job_id"] == job["id"]
    assert bodies["sweep.finished"]["data"]["status"] == "succeeded"


# --- client and CLI ---------------------------------------------------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_client_and_cli_manage_webhooks(keyed: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    settings = keyed.model_copy(update={"webhook_allowed_hosts": ["127.0.0.1"], **FAST})
    key = ALICE.split("=", 1)[1]
    with receiver() as hook, live_api(settings) as api:
        url = str(api.base_url)
        with Client(url, api_key=key) as client:
            made = client.webhooks.create(f"{hook.url}/c", event_types=["job.failed"], description="ci")
            assert made.secret is not None and made.event_types == ["job.failed"]
            assert [h.id for h in client.webhooks.list()] == [made.id]
            assert client.webhooks.get(made.id).secret is None
            assert client.webhooks.update(made.id, disabled=True).disabled is True
            with pytest.raises(ApiError) as refused:
                client.webhooks.create("http://10.0.0.1/", event_types=["job.failed"])
            assert refused.value.status_code == 422 and refused.value.field == "url"

        async def rotate_and_test() -> tuple[str | None, int]:
            async with AsyncClient(url, api_key=key) as client:
                await client.webhooks.update(made.id, disabled=False)
                rotated = await client.webhooks.rotate(made.id)
                delivery = await client.webhooks.test(made.id)
                return rotated.secret, delivery.id

        secret, delivery_id = asyncio.run(rotate_and_test())
        rows = finished(api, made.id, key=ALICE)
        assert rows[0]["id"] == delivery_id and secret is not None
        assert verified(secret, hook.requests[0])["type"] == "webhook.test"

        capsys.readouterr()
        flags = ["--url", url, "--api-key", key]
        assert cli(["webhooks", "create", f"{hook.url}/d", "--event", "sweep.finished", *flags]) == 0
        out, err = capsys.readouterr()
        assert "whsec_" in out and "shown once" in err
        assert cli(["webhooks", "ls", *flags]) == 0
        listed = capsys.readouterr().out
        assert f"{hook.url}/d" in listed and "whsec_" not in listed
        assert cli(["webhooks", "deliveries", str(made.id), *flags]) == 0
        assert (
            "webhook.test" in (shown := capsys.readouterr().out) and "delivered" in shown and "204" in shown
        )
        assert cli(["webhooks", "show", str(made.id), "--json", *flags]) == 0
        assert "secret" not in json.loads(capsys.readouterr().out)
        assert cli(["webhooks", "rm", str(made.id), *flags]) == 0
        assert "removed" in capsys.readouterr().out
        assert cli(["webhooks", "show", str(made.id), *flags]) != 0
