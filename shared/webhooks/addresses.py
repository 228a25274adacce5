"""Where webhooks may be sent (SSRF): only to globally routable addresses, unless the operator's
allow-list (GLUEJOBS_WEBHOOK_ALLOWED_HOSTS) names the host or a network holding its address.

An allow-list, not a deny-list: an address passes only when the standard library's `is_global` holds
for it and none of the narrower rules below refuses it (multicast, reserved and site-local addresses,
which Python 3.11's `is_global` lets through). An IPv6 address that carries an IPv4 address (IPv4-mapped
::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16, Teredo 2001::/32) reaches
that IPv4 address through the kernel or a relay, so the IPv4 address must pass too: 2002:7f00:1:: is
127.0.0.1 by way of a 6to4 relay.

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
        # ::ffff:127.0.0.1 is 127.0.0.1 (a dual-stack resolver may answer either): an allowed IPv4
        # network allows it too.
        embedded = embedded_ipv4(address)
        same = [address, embedded[1]] if embedded and embedded[2] else [address]
        return host.lower().rstrip(".") in self.names or any(a in net for a in same for net in self.networks)


# Networks that carry an IPv4 address in their low 32 bits and are the IPv4 address itself to
# whoever connects (the kernel for ::ffff:0:0/96; a NAT64 gateway for 64:ff9b::/96, RFC 6052), so the
# IPv4 address alone decides.
_IPV4_IN_LOW_BITS = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated (RFC 4291); :: and ::1 are not IPv4


def embedded_ipv4(address: IPAddress) -> tuple[str, ipaddress.IPv4Address, bool] | None:
    """The IPv4 address an IPv6 transition form carries: (the form's name, the IPv4 address, whether
    the IPv4 address alone decides), or None for an address that carries none."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped, True
    if address in _IPV4_IN_LOW_BITS:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), True
    if address.sixtofour is not None:
        return "6to4", address.sixtofour, False
    if address.teredo is not None:
        return "Teredo", address.teredo[1], False  # (server, client): packets go to the client
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return "IPv4-compatible", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), False
    return None


# Ranges set aside after Python 3.11's tables were written, which its `is_global` still calls global:
# 3fff::/20 (RFC 9637, 2024, IPv6 documentation), found by the hostile re-test of issue 32.
_DOCUMENTATION_SINCE_311 = (ipaddress.ip_network("3fff::/20"),)


def _own_rule(address: IPAddress) -> str | None:
    """The rule that refuses `address` itself, or None when it is globally routable. `is_global` is
    the allow-list; the named rules before it only say why (and catch what 3.11's `is_global` misses:
    multicast, reserved, site-local fec0::/10, documentation ranges newer than its tables)."""
    site_local = isinstance(address, ipaddress.IPv6Address) and address.is_site_local
    for rule, refused in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("site-local", site_local),
        ("documentation", any(address in network for network in _DOCUMENTATION_SINCE_311)),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("not globally routable", not address.is_global),
    ):
        if refused:
            return rule
    return None


def address_rule(address: IPAddress) -> str | None:
    """Which rule refuses `address` (loopback, private …), or None for a globally routable address;
    for a transition form, the rule of the IPv4 address it carries (::ffff:127.0.0.1 is loopback)."""
    embedded = embedded_ipv4(address)
    if embedded is None:
        return _own_rule(address)
    _form, ipv4, ipv4_decides = embedded
    return _own_rule(ipv4) or (None if ipv4_decides else _own_rule(address))


def _refusal(address: IPAddress, rule: str) -> str:
    """'a loopback address', or for a transition form 'a loopback address (the 6to4 form of 127.0.0.1)'."""
    embedded = embedded_ipv4(address)
    via = f" (the {embedded[0]} form of {embedded[1]})" if embedded else ""
    return f"a {rule} address{via}"


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
                f"{shown} {_refusal(address, rule)}: webhooks are sent only to globally routable "
                f"addresses unless {ALLOW_SETTING} names the host or its network"
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
