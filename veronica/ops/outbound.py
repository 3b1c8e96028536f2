"""Outbound HTTP to addresses people type in (the notifier's webhook and Slack URLs, MCP servers
attached by URL) must not reach the host's own network: loopback, private, link-local (the cloud
metadata service at 169.254.169.254), shared, reserved or multicast addresses, and IPv6 forms that
embed one (mapped, 6to4, NAT64), are refused unless
the host is on that purpose's allow-list (VERONICA_NOTIFY_ALLOW_HOSTS, VERONICA_MCP_ALLOW_HOSTS).

Checked twice: when the URL is saved (literal addresses, localhost names, and what the name
resolves to now) and when a request is sent. At send time the check sits in the connection itself:
the name is resolved once, every address is checked, and the socket connects to that checked
address (TLS still verifies the name), so a DNS answer that changes between check and connect
(rebinding) cannot slip an internal address in.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpcore
import httpx
from django.conf import settings

from veronica.plumbing.errors import VeronicaError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "metadata.google.internal")


class Refused(VeronicaError):
    """An outbound target on the host's own network."""


@dataclass(frozen=True)
class Purpose:
    """Who is connecting: names the allow-list setting and the words of the refusal."""

    setting: str  # the settings attribute holding the allow-list
    env: str  # its environment variable, named in the error
    what: str  # "outbound notifications", "MCP servers"


NOTIFY = Purpose("NOTIFY_ALLOW_HOSTS", "VERONICA_NOTIFY_ALLOW_HOSTS", "outbound notifications")
MCP = Purpose("MCP_ALLOW_HOSTS", "VERONICA_MCP_ALLOW_HOSTS", "MCP servers")
A2A = Purpose("A2A_ALLOW_HOSTS", "VERONICA_A2A_ALLOW_HOSTS", "remote A2A agents")


def _allow_list(purpose: Purpose) -> tuple[frozenset[str], tuple]:
    """Host names (exact, case-insensitive) and IP networks; settings has validated each item."""
    names, networks = set(), []
    for item in getattr(settings, purpose.setting):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            names.add(item.lower().rstrip("."))
    return frozenset(names), tuple(networks)


# IPv6 forms that carry an IPv4 address a gateway or the kernel may forward to: 6to4 (2002::/16,
# bits 16-48), NAT64's well-known prefix (64:ff9b::/96, the last 32 bits), IPv4-mapped and the old
# IPv4-compatible ::/96. Each is judged by the IPv4 address inside it. NAT64's local-use prefix
# (64:ff9b:1::/48, RFC 8215) is a site's own translator: internal whatever it embeds.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, NAT64, compatible), else None."""
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def internal(ip: Address) -> bool:
    if ip.version == 6 and ip in _NAT64_LOCAL:
        return True
    ip = embedded_ipv4(ip) or ip
    return not ip.is_global or ip.is_multicast or ip.is_unspecified


def _allowed_ip(ip: Address, networks: tuple) -> bool:
    inner = embedded_ipv4(ip)  # ::ffff:127.0.0.1 (or 2002:7f00:1::) is allowed by 127.0.0.1, as internal() judges it
    return any(ip.version == net.version and ip in net or inner is not None and inner in net for net in networks)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int) -> list[Address]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


def checked_addresses(host: str, port: int, field: str, *, must_resolve: bool, purpose: Purpose = NOTIFY) -> list[Address]:
    """The addresses a connection to host may use; Refused if any is internal and not allowed."""
    names, networks = _allow_list(purpose)
    host = host.lower().rstrip(".")
    if host in names:
        return resolve(host, port) if must_resolve else []
    literal = _literal(host)
    if literal is None and (host in _LOCAL_NAMES or host.endswith(".localhost")):
        raise Refused(f"{field} points at {host}, this host's own network; {purpose.what} may not "
                      f"(allow it with {purpose.env})", field=field)
    try:
        addresses = [literal] if literal is not None else resolve(host, port)
    except OSError as exc:
        if must_resolve:
            raise Refused(f"{field}: cannot resolve {host} ({exc})", field=field) from None
        return []  # saved now, checked again when something is sent
    for ip in addresses:
        if internal(ip) and not _allowed_ip(ip, networks):
            raise Refused(f"{field} points at {ip} ({host}), an internal address (loopback, private, link-local or "
                          f"reserved); {purpose.what} may not go there (allow it with {purpose.env})",
                          field=field)
    return addresses


def scrub_url(url: str) -> str:
    """A URL without the parts that carry credentials: user:password@ and the query string (what an
    export, an event or a viewer is shown of a URL an owner typed)."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def check_url(url: str, field: str, purpose: Purpose = NOTIFY) -> None:
    """Save-time check of a URL that has already passed the http(s) validator."""
    parts = urlsplit(url)
    checked_addresses(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80), field,
                      must_resolve=False, purpose=purpose)


class _GuardedBackend(httpcore.SyncBackend):
    """Resolve, check and connect to the checked address (one resolution: no rebinding window)."""

    def __init__(self, purpose: Purpose = NOTIFY) -> None:
        super().__init__()
        self.purpose = purpose

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        addresses = checked_addresses(host, port, "url", must_resolve=True, purpose=self.purpose)
        last: Exception | None = None
        for ip in addresses:
            try:
                return super().connect_tcp(str(ip), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last = exc
        raise last or httpcore.ConnectError(f"{host} has no address")


def client(timeout: float, purpose: Purpose = NOTIFY) -> httpx.Client:
    """An httpx client whose every connection goes through the guard (and ignores proxy env vars,
    which would move the connection, and the check, to the proxy)."""
    transport = httpx.HTTPTransport()
    transport._pool._network_backend = _GuardedBackend(purpose)  # httpcore's documented backend hook, set on httpx's pool
    return httpx.Client(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False)


def async_client_factory(purpose: Purpose = MCP):
    """For the MCP SDK, whose HTTP transport is httpx2 (async): an AsyncClient whose connections go
    through the same check, resolving in a worker thread so the event loop never blocks on DNS."""
    import anyio
    import httpcore2
    import httpx2
    from httpcore2._backends.auto import AutoBackend

    class _GuardedAsyncBackend(AutoBackend):
        async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            addresses = await anyio.to_thread.run_sync(
                lambda: checked_addresses(host, port, "url", must_resolve=True, purpose=purpose))
            last: Exception | None = None
            for ip in addresses:
                try:
                    return await super().connect_tcp(str(ip), port, timeout, local_address, socket_options)
                except httpcore2.ConnectError as exc:
                    last = exc
            raise last or httpcore2.ConnectError(f"{host} has no address")

    def make(timeout) -> "httpx2.AsyncClient":
        transport = httpx2.AsyncHTTPTransport(trust_env=False)
        transport._pool._network_backend = _GuardedAsyncBackend()  # the same documented hook as above
        return httpx2.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False, trust_env=False)

    return make
