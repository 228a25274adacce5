"""`gluejobs webhooks create|ls|show|rm|rotate|test|enable|disable|deliveries`: an owner's webhook
endpoints.

An endpoint's signing secret is printed once, by the command that made it (create, rotate), with a
line on stderr saying it will not be shown again; `ls` and `show` never have it to show.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from gluejobs.cli.base import Choice, ClientCommand, Group, Invocation, note
from gluejobs.cli.output import table, when
from gluejobs.client import Client, Webhook, WebhookDelivery

# What an endpoint can subscribe to, and what `create` subscribes it to without --event: the API's
# words, from their one home.
from shared.wire.vocabulary import EVENT_TYPES, JOB_EVENTS

SHOWN_ONCE = "this secret is shown once and will not be shown again: keep it now"
WEBHOOK_ID = click.argument("webhook_id", type=int, metavar="WEBHOOK")


@click.group("webhooks", cls=Group)
def webhooks() -> None:
    """Your webhook endpoints and what was sent to them."""


@webhooks.command("create", cls=ClientCommand, json="the endpoint, with its secret")
# Not `url`: every client command has --url, the API's address.
@click.argument("endpoint_url", metavar="URL")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=Choice(EVENT_TYPES),
    metavar="TYPE",
    help=f"An event to send (repeat the flag; default: the job events). One of: {', '.join(EVENT_TYPES)}.",
)
@click.option("--description", help="A label to tell endpoints apart.")
def create(api: Invocation, endpoint_url: str, events: tuple[str, ...], description: str | None) -> None:
    """Register an endpoint; prints its signing secret once.

    Events are POSTed, signed, to the http(s) URL."""
    with api.client() as client:
        hook = client.webhooks.create(
            endpoint_url, event_types=list(events or JOB_EVENTS), description=description
        )
    _made(api, hook)


@webhooks.command("rotate", cls=ClientCommand, json="the endpoint, with its new secret")
@WEBHOOK_ID
def rotate(api: Invocation, webhook_id: int) -> None:
    """A new signing secret, printed once."""
    with api.client() as client:
        hook = client.webhooks.rotate(webhook_id)
    _made(api, hook)


def _made(api: Invocation, hook: Webhook) -> None:
    api.show(hook.raw, [_line(hook), str(hook.secret)])
    note(SHOWN_ONCE)


@webhooks.command("ls", cls=ClientCommand, json="the endpoints (a list)")
def ls(api: Invocation) -> None:
    """Your endpoints (never their secrets)."""
    with api.client() as client:
        hooks = list(client.webhooks.list())
    api.show([h.raw for h in hooks], _table(hooks) if hooks else "no webhooks")


def _one(name: str, help: str, act: Callable[[Client, int], Webhook], done: str) -> click.Command:

    @webhooks.command(name, cls=ClientCommand, json="the endpoint", help=help)
    @WEBHOOK_ID
    def command(api: Invocation, webhook_id: int) -> None:
        with api.client() as client:
            hook = act(client, webhook_id)
        api.show(hook.raw, _line(hook) + done)

    return command


# A command on one endpoint that answers with it: its name, help, call and what the line adds.
for _name, _help, _act, _done in (
    ("show", "One endpoint (never its secret).", lambda client, id_: client.webhooks.get(id_), ""),
    (
        "rm",
        "Remove an endpoint and its delivery log.",
        lambda client, id_: client.webhooks.delete(id_),
        " (removed)",
    ),
    (
        "enable",
        "Send events again.",
        lambda client, id_: client.webhooks.update(id_, disabled=False),
        " (enabled)",
    ),
    (
        "disable",
        "Send nothing until enabled (deliveries wait).",
        lambda client, id_: client.webhooks.update(id_, disabled=True),
        " (disabled)",
    ),
):
    _one(_name, _help, _act, _done)


@webhooks.command("test", cls=ClientCommand, json="the delivery")
@WEBHOOK_ID
def test(api: Invocation, webhook_id: int) -> None:
    """Send a webhook.test event now."""
    with api.client() as client:
        delivery = client.webhooks.test(webhook_id)
    api.show(delivery.raw, f"test event queued as delivery {delivery.id} ({delivery.message_id})")


@webhooks.command("deliveries", cls=ClientCommand, json="the deliveries (a list)")
@WEBHOOK_ID
@click.option("--limit", type=int, default=20, show_default=True, help="At most this many deliveries.")
def deliveries(api: Invocation, webhook_id: int, limit: int) -> None:
    """What was sent to an endpoint, newest first.

    Each delivery: event, status, attempts, each attempt's status code or error."""
    sent: list[WebhookDelivery] = []
    with api.client() as client:
        for delivery in client.webhooks.deliveries(webhook_id, page_size=min(max(limit, 1), 100)):
            sent.append(delivery)
            if len(sent) >= limit:
                break
    api.show([d.raw for d in sent], _deliveries(sent) if sent else "no deliveries")


def _line(hook: Webhook) -> str:
    state = "disabled" if hook.disabled else "enabled"
    return f"webhook {hook.id} → {hook.url} [{', '.join(hook.event_types)}] {state}"


def _table(hooks: list[Webhook]) -> list[str]:
    rows = [
        [
            str(h.id),
            h.url,
            ",".join(h.event_types),
            "disabled" if h.disabled else "enabled",
            h.description or "-",
        ]
        for h in hooks
    ]
    return table(("id", "url", "events", "state", "description"), rows, right={"id"})


def _deliveries(sent: list[WebhookDelivery]) -> list[str]:
    rows = []
    for d in sent:
        outcomes = [str(a.get("status_code") or a.get("error") or "?") for a in d.attempt_log]
        rows.append(
            [
                str(d.id),
                when(d.created_at),
                d.event_type,
                d.status,
                str(d.attempts),
                " ".join(outcomes) or "-",
            ]
        )
    columns = ("id", "created", "event", "status", "attempts", "each attempt")
    return table(columns, rows, right={"id", "attempts"})


COMMANDS = (webhooks,)
