"""Standard Webhooks signatures (https://www.standardwebhooks.com), through the `standardwebhooks`
package, the specification's own reference implementation: `webhook-signature` is
`v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">` under the endpoint's secret,
and a receiver verifies it with the same package (`Webhook(secret).verify(body, headers)`)."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """`whsec_` and the base64 of 32 random bytes, the form Standard Webhooks' libraries take."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signed_headers(secret: str, *, message_id: str, timestamp: datetime, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers for sending `body` as message `message_id` at `timestamp`."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, timestamp, body),
    }
