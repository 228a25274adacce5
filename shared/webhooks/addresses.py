"""Where webhooks may be sent (SSRF): never to this machine, its private network, link-local
addresses (cloud metadata at 169.254.169.254), multicast, unspecified or reserved addresses, unless
the operator's allow-list (GLUEJOBS_WEBHOOK_ALLOWED_HOSTS) names the host or a network holding its
address.

A host name is resolved and every address it resolves to is checked; the sender then connects to an
address it checked (never resolving again), so a name that resolves to a public address when checked
and to a private one a moment later (DNS rebinding) cannot steer a delivery inside.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
ALLOW_SETTING = "GLUEJOBS_WEBHOOK_ALLOWED_HOSTS"
SCHEMES = ("http", "https")


class RefusedTarget(ValueError):
    """A webhook URL the service will not send to; the message names the rule."""


@dataclass(frozen=True)
class AllowList:
    """Host names and networks (`10.0.0.0/8`, `127.0.0.1`) a webhook may reach although the address
    rules would refuse them."""

    names: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        names, networks = set(), []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                names.add(entry.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: IPAddress) -> bool:
        return host.lower().rstrip(".") in self.names or any(address in net for net in self.networks)


def address_rule(address: IPAddress) -> str | None:
    """Which rule refuses `address` (loopback, private …), or None for a public address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for rule, refused in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("not globally routable", not address.is_global),
    ):
        if refused:
            return rule
    return None


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart: scheme, host (as written, without brackets), port, and the path
    with its query."""

    url: str
    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise RefusedTarget(f"the URL is malformed ({exc})") from None
        if parts.scheme not in SCHEMES:
            raise RefusedTarget("the URL must start with http:// or https://")
        if not parts.hostname:
            raise RefusedTarget("the URL has no host")
        if parts.username is not None or parts.password is not None:
            raise RefusedTarget("the URL must not hold a user name or password (it would be shown in lists)")
        if parts.fragment:
            raise RefusedTarget("the URL must not hold a #fragment")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if parts.scheme == "https" else 80
        return cls(url, parts.scheme, parts.hostname, port or default, path)

    def literal_address(self) -> IPAddress | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def check_addresses(target: Target, addresses: Sequence[IPAddress], allow: AllowList) -> list[IPAddress]:
    """`addresses` (what the target's host resolves to), once every one of them passes the rules or
    the allow-list; RefusedTarget naming the rule and the address otherwise."""
    if not addresses:
        raise RefusedTarget(f"the host {target.host!r} resolves to no address")
    for address in addresses:
        rule = address_rule(address)
        if rule is not None and not allow.allows(target.host, address):
            literal = target.literal_address() is not None
            shown = f"{address} is" if literal else f"{target.host!r} resolves to {address},"
            raise RefusedTarget(
                f"{shown} a {rule} address: webhooks are not sent to loopback, link-local, "
                f"private, multicast, unspecified or reserved addresses unless {ALLOW_SETTING} names the "
                "host or its network"
            )
    return list(addresses)


def resolve(target: Target) -> list[IPAddress]:
    """The target's addresses (a literal address is itself); RefusedTarget when it does not resolve.
    Blocking: for the API's request threads (registration); the dispatcher resolves asynchronously."""
    literal = target.literal_address()
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise RefusedTarget(f"the host {target.host!r} does not resolve ({exc})") from None
    return addresses_of(infos)


def addresses_of(infos: Iterable[tuple[object, ...]]) -> list[IPAddress]:
    """The distinct addresses of getaddrinfo's answer, in its order (scope ids dropped)."""
    found: dict[IPAddress, None] = {}
    for info in infos:
        sockaddr = info[4]
        assert isinstance(sockaddr, tuple)
        found[ipaddress.ip_address(str(sockaddr[0]).split("%")[0])] = None
    return list(found)


def checked_target(url: str, allow: AllowList) -> Target:
    """The URL, parsed and its addresses checked (registration); RefusedTarget naming the rule."""
    target = Target.parse(url)
    check_addresses(target, resolve(target), allow)
    return target
