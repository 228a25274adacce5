"""Does one slow webhook receiver hold up another owner's deliveries (issue 32 item 3)? The API's
webhook dispatcher (service/background/webhook_dispatcher.py) with the default settings (10 s deadline,
8 at once, 2 per endpoint, 4 per owner, 1 s poll) sends from a scratch database to real receivers on
127.0.0.1: owner `slow` has `--slow-endpoints` endpoints on a receiver that sends its headers and then
a byte every `--drip-s` seconds (the report's receiver), each with `--slow-deliveries` deliveries
queued; from 3 s later owner `quick` has one delivery queued every `--every-s` seconds for
`--seconds`, to a receiver that answers at once. Printed, one JSON line per database: the quick
deliveries' latency from their commit to their arrival at the receiver (p50, p90, max: the poll is
part of it, as for a job's event written by a worker), and how long the slow attempts lasted (max:
the deadline) and how many ended meanwhile.

    python bench/webhook_isolation.py
    python bench/webhook_isolation.py --databases sqlite --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import bench_settings, load_average, percentile, run_folder, scratch_postgres  # noqa: E402
from service.background.webhook_dispatcher import Dispatcher  # noqa: E402
from shared.core.config import Settings  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import WebhookDelivery  # noqa: E402
from shared.webhooks import endpoints  # noqa: E402
from tests.support.webhook_receiver import receiver  # noqa: E402


async def measure(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    db = Database(settings.database_url)
    upgrade(db)
    dispatcher = Dispatcher(settings, db)
    with receiver(drip="body", drip_s=args.drip_s) as slow_hook, receiver() as quick_hook:
        with db.session() as session:
            slow = [
                endpoints.create_endpoint(
                    session, owner="slow", url=f"{slow_hook.url}/{i}", event_types=["job.failed"]
                )
                for i in range(args.slow_endpoints)
            ]
            quick = endpoints.create_endpoint(
                session, owner="quick", url=f"{quick_hook.url}/", event_types=["job.failed"]
            )
            for endpoint in slow * args.slow_deliveries:
                endpoints.send_test(session, endpoint_id=endpoint.id)
        task = asyncio.create_task(dispatcher.run())
        await asyncio.sleep(3.0)  # the slow receiver's attempts are under way
        queued: dict[str, float] = {}
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            delivery = await asyncio.to_thread(queue_one, db, quick.id)
            queued[delivery] = time.monotonic()
            await asyncio.sleep(args.every_s)
        await asyncio.sleep(3.0)  # the last one's poll and send
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        arrived = {r.headers["webhook-id"]: r.at for r in quick_hook.requests}
        latencies = [arrived[m] - queued[m] for m in queued if m in arrived]
        with db.session() as session:
            slow_attempts = [
                attempt
                for endpoint in slow
                for row in endpoints.list_deliveries(session, endpoint_id=endpoint.id, limit=1000)[0]
                for attempt in row.attempt_log
            ]
    db.dispose()
    return {
        "quick_sent": len(queued),
        "quick_arrived": len(latencies),
        "quick_latency_p50_s": percentile(latencies, 0.5),
        "quick_latency_p90_s": percentile(latencies, 0.9),
        "quick_latency_max_s": round(max(latencies), 2),
        "slow_attempts_ended": len(slow_attempts),
        "slow_attempt_max_s": round(max((a["duration_ms"] for a in slow_attempts), default=0) / 1000, 2),
        "slow_connections_opened": len(slow_hook.requests),
    }


def queue_one(db: Database, endpoint_id: int) -> str:
    """A delivery for the quick owner, committed; its message id (the webhook-id header)."""
    with db.session() as session:
        delivery: WebhookDelivery = endpoints.send_test(session, endpoint_id=endpoint_id)
        return delivery.message_id


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--databases", default="sqlite,postgres", help="which of sqlite,postgres")
    parser.add_argument("--slow-endpoints", type=int, default=3)
    parser.add_argument("--slow-deliveries", type=int, default=4, help="queued for each slow endpoint")
    parser.add_argument("--drip-s", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=1.0)
    args = parser.parse_args()
    print(f"load average {load_average()}", flush=True)
    for database in args.databases.split(","):
        with run_folder("webhook-isolation-") as root:
            if database == "postgres":
                with scratch_postgres(args.postgres_url, f"bench_webhooks_{uuid.uuid4().hex[:8]}") as url:
                    settings = bench_settings(root, database_url=url, webhook_allowed_hosts=["127.0.0.1"])
                    figures = asyncio.run(measure(settings, args))
            else:
                settings = bench_settings(root, webhook_allowed_hosts=["127.0.0.1"])
                figures = asyncio.run(measure(settings, args))
        knobs = {
            "timeout_s": settings.webhook_timeout_s,
            "per_endpoint": settings.webhook_endpoint_concurrency,
            "per_owner": settings.webhook_owner_concurrency,
            "concurrency": settings.webhook_concurrency,
            "poll_s": settings.webhook_poll_s,
        }
        print(json.dumps({"database": database, **knobs, **figures}), flush=True)
    print(f"load average {load_average()}", flush=True)


if __name__ == "__main__":
    main()
