"""Which addresses the browser may connect to, checked where the connection is made.

A model told to browse must not reach the machine's own services (127.0.0.1), the cloud's
metadata service (169.254.169.254) or the local network (10.x, 192.168.x, ...). A host name is
checked after DNS resolution, so `localhost` or a public name pointing at a private address is
refused too, and the connection goes to the very address that was checked (no second lookup a
DNS-rebinding server could answer differently). The check sits in the HTTP client's network
backend, so it applies to every connection: the first request and every redirect hop.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore2
import trio

from rollouts.environments.tools import ToolError

_OPT_IN = "BrowsingEnvironment(allow_private_addresses=True)"


def address_kind(address: str) -> str | None:
    """None if `address` (an IP literal) is public, else what it is ("loopback", "private", ...)."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            ip = embedded
    for kind, flag in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("private", ip.is_private),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return kind
    return None if ip.is_global else "non-public"


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def blocked(host: str, address: str, kind: str) -> ToolError:
    shown = address if host == address else f"{host} (it resolves to {address})"
    return ToolError(
        f"Refused to fetch from {shown}: a {kind} address. This browser reaches only public "
        "addresses (not the machine itself, the local network or a cloud metadata service) unless "
        f"the environment allows private ones ({_OPT_IN})."
    )


class PublicOnlyBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's trio backend, resolving each host itself and connecting only to the addresses
    it checked: all of them must be public unless `allow_private`."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private
        self._trio = httpcore2.TrioBackend()

    async def _resolve(self, host: str, port: int) -> list[str]:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        seen: dict[str, None] = {}
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                seen[str(sockaddr[0])] = None
        return list(seen)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await self._resolve(host, port)
        except OSError as e:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {e}") from None
        if not addresses:
            raise httpcore2.ConnectError(f"{host} has no IPv4 or IPv6 address")
        if not self.allow_private:
            for address in addresses:  # one non-public address is enough to refuse the host
                kind = address_kind(address)
                if kind is not None:
                    raise blocked(host, address, kind)
        error: Exception | None = None
        for address in addresses:  # the checked addresses themselves: no second lookup
            try:
                stream: httpcore2.AsyncNetworkStream = await self._trio.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
                return stream
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as e:
                error = e
        assert error is not None
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("the browser does not connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def guarded_transport(*, allow_private: bool) -> Any:
    """An httpx2 transport whose connections all go through PublicOnlyBackend."""
    import httpx2

    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    pool = transport._pool
    # httpx2 takes no network backend argument; its pool keeps the one it uses here. Fail loudly
    # (rather than browse unguarded) if a new version moves it.
    assert isinstance(pool, httpcore2.AsyncConnectionPool) and hasattr(pool, "_network_backend"), (
        "httpx2's connection pool changed: the browser's address guard cannot be installed"
    )
    pool._network_backend = PublicOnlyBackend(allow_private=allow_private)
    return transport
