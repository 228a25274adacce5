"""Which Host and Origin headers the API answers: the defence against DNS rebinding and against web
pages that send requests to an API on the user's machine.

- Host: a page on a name the attacker controls can make that name resolve to 127.0.0.1 (DNS
  rebinding); the browser then sends `Host: evil.example` and treats the API's answers as the
  page's own. So a request must name the API by its bound address, a loopback name, or a name the
  operator lists (GLUEJOBS_ALLOWED_HOSTS). Bound to a wildcard (0.0.0.0, ::), any IP address
  counts as the bound address (an address cannot be rebound) and so does the machine's own name.
- Origin: a page anywhere can POST to http://127.0.0.1:8000 (a form needs no CORS); the browser
  names the page in `Origin`. A state-changing request from another origin is refused; one with no
  Origin comes from a client that is not a browser (curl, the Python client) and is allowed, as are
  browsers on the API's own origin (the dashboard) and GLUEJOBS_ALLOWED_ORIGINS.

Starlette's TrustedHostMiddleware does the Host half, but answers in plain text and knows nothing of
the bound address; these rules answer in the API's error body (service/edge/guard.py).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.core.config import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})
LOOPBACK_NAMES = frozenset({"localhost"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def split_host(header: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header, the name lowercased without a trailing dot; None when malformed."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        name, _, rest = value[1:].partition("]")
        if _ip(name) is None or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(":")
        name = name.rstrip(".")
    if not name or (port and not (port.isascii() and port.isdigit() and len(port) <= 5)):
        return None
    return name, int(port) if port else None


@dataclass(frozen=True)
class HostRules:
    names: frozenset[str]
    suffixes: tuple[str, ...]  # from "*.example.org" entries: ".example.org"
    any_host: bool  # "*" listed
    any_address: bool  # bound to a wildcard address
    bound_address: str | None
    origins: frozenset[str]

    @classmethod
    def for_server(cls, settings: Settings, bound_host: str | None) -> HostRules:
        """The rules for an API bound to `bound_host` (None: not known, taken as the default loopback)."""
        bound = (bound_host or "127.0.0.1").strip("[]").lower()
        names = set(LOOPBACK_NAMES)
        any_address = bound in WILDCARD_ADDRESSES
        if any_address:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        elif _ip(bound) is None:
            names.add(bound.rstrip("."))  # bound by name
        listed = [entry.strip().lower() for entry in settings.allowed_hosts]
        return cls(
            names=frozenset(names | {entry.rstrip(".") for entry in listed if "*" not in entry}),
            suffixes=tuple(entry[1:] for entry in listed if entry.startswith("*.") and len(entry) > 2),
            any_host="*" in listed,
            any_address=any_address,
            bound_address=bound if _ip(bound) is not None else None,
            origins=frozenset(_origin_key(entry) for entry in settings.allowed_origins) - {None},  # type: ignore[arg-type]
        )

    def allows_host(self, header: str | None) -> bool:
        if header is None:
            return True  # HTTP/1.0 without Host: not a browser (browsers always send one)
        split = split_host(header)
        if split is None:
            return False
        name = split[0]
        if self.any_host or name in self.names or name.endswith(self.suffixes):
            return True
        address = _ip(name)
        if address is None:
            return False
        return self.any_address or address.is_loopback or name == self.bound_address

    def allows_origin(self, origin: str, host_header: str | None) -> bool:
        """Whether a state-changing request from a page on `origin` is allowed: the API's own origin
        (the host and port the browser addressed, as its Host header says) or a listed one."""
        key = _origin_key(origin)
        if key is None:
            return False  # "null" (sandboxed pages, file://) or garbage
        if key in self.origins:
            return True
        addressed = split_host(host_header) if host_header is not None else None
        if addressed is None:
            return False
        scheme, _, rest = key.partition("://")
        origin_name, _, origin_port = rest.rpartition(":")
        host, port = addressed
        # The scheme is not compared: behind a proxy that ends TLS the API sees http while the page is
        # https. A Host without a port addressed the default port of the origin's scheme.
        return host == origin_name.strip("[]") and int(origin_port) == (port or _DEFAULT_PORTS[scheme])


def _origin_key(value: str) -> str | None:
    """`scheme://host:port` with the default port written out, lowercased; None when not an origin."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.hostname.rstrip('.')}:{port or _DEFAULT_PORTS[parts.scheme]}"
