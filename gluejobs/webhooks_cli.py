"""`gluejobs webhooks create|ls|show|rm|rotate|test|deliveries`: an owner's webhook endpoints.

An endpoint's signing secret is printed once, by the command that made it (create, rotate), with a
line on stderr saying it will not be shown again; `ls` and `show` never have it to show.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gluejobs.client import Client, Webhook, WebhookDelivery
from gluejobs.output import print_json, table

AddClientCommand = Callable[..., argparse.ArgumentParser]
EVENT_TYPES = (
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "sweep.finished",
    "search.finished",
    "checkpoint.declared",
)
SHOWN_ONCE = "this secret is shown once and will not be shown again: keep it now"


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    hooks = commands.add_parser(
        "webhooks", help="webhook endpoints: create, ls, show, rm, rotate, test, deliveries, enable, disable"
    )
    actions = hooks.add_subparsers(dest="webhooks_command", required=True)
    create = client_command(actions, "create", help="register an endpoint; prints its signing secret once")
    # Not `url`: every client command has --url, the API's address.
    create.add_argument("endpoint_url", metavar="URL", help="the http(s) URL events are POSTed to")
    create.add_argument(
        "--event",
        dest="events",
        action="append",
        choices=EVENT_TYPES,
        metavar="TYPE",
        help=f"an event to send (repeat the flag; default: the job events). One of: {', '.join(EVENT_TYPES)}",
    )
    create.add_argument("--description", help="a label to tell endpoints apart")
    _json(create, "the endpoint, with its secret")
    ls = client_command(actions, "ls", help="your endpoints (never their secrets)")
    _json(ls, "the endpoints")
    for name, what in (
        ("show", "one endpoint (never its secret)"),
        ("rm", "remove an endpoint and its delivery log"),
        ("rotate", "a new signing secret, printed once"),
        ("test", "send a webhook.test event now"),
        ("enable", "send events again"),
        ("disable", "send nothing until enabled (deliveries wait)"),
    ):
        action = client_command(actions, name, help=what)
        action.add_argument("webhook_id", type=int)
        _json(action, "the answer")
    deliveries = client_command(actions, "deliveries", help="what was sent, newest first, with each attempt")
    deliveries.add_argument("webhook_id", type=int)
    deliveries.add_argument("--limit", type=int, default=20, help="at most this many deliveries")
    _json(deliveries, "the deliveries")


def _json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"{what}: one JSON document")


def run_webhooks(args: argparse.Namespace, client: Client) -> int:
    command = args.webhooks_command
    hooks = client.webhooks
    if command == "ls":
        rows = list(hooks.list())
        return _show(args, [h.raw for h in rows], "\n".join(_table(rows)) if rows else "no webhooks")
    if command == "deliveries":
        sent: list[WebhookDelivery] = []
        for delivery in hooks.deliveries(args.webhook_id, page_size=min(max(args.limit, 1), 100)):
            sent.append(delivery)
            if len(sent) >= args.limit:
                break
        return _show(args, [d.raw for d in sent], "\n".join(_deliveries(sent)) if sent else "no deliveries")
    if command == "test":
        delivery = hooks.test(args.webhook_id)
        return _show(
            args, delivery.raw, f"test event queued as delivery {delivery.id} ({delivery.message_id})"
        )
    if command in ("create", "rotate"):
        if command == "create":
            events = args.events or ["job.succeeded", "job.failed", "job.cancelled"]
            hook = hooks.create(args.endpoint_url, event_types=events, description=args.description)
        else:
            hook = hooks.rotate(args.webhook_id)
        _show(args, hook.raw, f"{_line(hook)}\n{hook.secret}")
        print(SHOWN_ONCE, file=sys.stderr)
        return 0
    actions: dict[str, Callable[[int], Webhook]] = {
        "show": hooks.get,
        "rm": hooks.delete,
        "enable": lambda webhook_id: hooks.update(webhook_id, disabled=False),
        "disable": lambda webhook_id: hooks.update(webhook_id, disabled=True),
    }
    hook = actions[command](args.webhook_id)
    done = {"rm": " (removed)", "enable": " (enabled)", "disable": " (disabled)"}.get(command, "")
    return _show(args, hook.raw, _line(hook) + done)


def _show(args: argparse.Namespace, raw: Any, text: str) -> int:
    if args.json:
        print_json(raw)
    else:
        print(text)
    return 0


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


def _deliveries(deliveries: list[WebhookDelivery]) -> list[str]:
    rows = []
    for d in deliveries:
        outcomes = [str(a.get("status_code") or a.get("error") or "?") for a in d.attempt_log]
        when = d.created_at.strftime("%Y-%m-%d %H:%M:%S") if d.created_at else "-"
        rows.append([str(d.id), when, d.event_type, d.status, str(d.attempts), " ".join(outcomes) or "-"])
    return table(
        ("id", "created", "event", "status", "attempts", "each attempt"), rows, right={"id", "attempts"}
    )
