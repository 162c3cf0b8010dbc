"""Who may talk to `rollouts view`: the host names it answers for, and its access token.

DNS rebinding: a page on another site can point its own host name at 127.0.0.1 and read what a
local server answers, since the browser thinks it talks to that site. The browser still sends
the site's name in `Host`, so the viewer answers only for the names it is served under
(localhost, 127.0.0.1, ::1, and the `--host` it was given): any other `Host` gets 421.

On an address other than the loopback one the viewer is reachable by other machines, so it
also needs a token (made at start and printed once in the URL, as Jupyter does): `?token=...`
sets an HttpOnly, SameSite=Strict cookie and redirects to the same page without it; every route
(pages, API, live streams, static files) then needs the cookie (or `Authorization: Bearer`).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

__all__ = ["LOCAL_HOSTS", "TOKEN_COOKIE", "HostGuard", "host_name", "is_local"]

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
TOKEN_COOKIE = "rollouts_view_token"


def host_name(value: str) -> str:
    """The host name of a `Host` header (no port, no IPv6 brackets, lowercase)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def is_local(host: str) -> bool:
    """Whether `host` (a --host value) is a loopback address only this machine reaches."""
    return host_name(host) in LOCAL_HOSTS or host_name(host).startswith("127.")


def _headers(scope: Any) -> dict[bytes, str]:
    return {bytes(k).lower(): bytes(v).decode("latin-1") for k, v in scope.get("headers", [])}


def _cookie(headers: dict[bytes, str], name: str) -> str | None:
    for part in headers.get(b"cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class HostGuard:
    """ASGI middleware: 421 for a `Host` not in `hosts` (None: any), 401 without `token` (None:
    none needed). See the module docstring."""

    def __init__(self, app: ASGIApp, *, hosts: Iterable[str] | None, token: str | None, cookie_path: str = "/") -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(host_name(h) for h in hosts)
        self.token = token
        self.cookie_path = cookie_path or "/"

    def _has_token(self, headers: dict[bytes, str]) -> bool:
        assert self.token is not None
        given = _cookie(headers, TOKEN_COOKIE) or ""
        auth = headers.get(b"authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        response: Response | None = None
        if self.hosts is not None and host_name(headers.get(b"host", "")) not in self.hosts:
            names = ", ".join(sorted(self.hosts))
            response = PlainTextResponse(f"this viewer answers only for the host names {names}", 421)
        elif self.token is not None and not self._has_token(headers):
            query = parse_qsl(bytes(scope.get("query_string", b"")).decode("latin-1"), keep_blank_values=True)
            given = next((v for k, v in query if k == "token"), None)
            if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                path = str(scope.get("root_path", "")) + str(scope.get("path", "/"))
                redirect = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
                redirect.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict", path=self.cookie_path)
                response = redirect
            else:
                response = PlainTextResponse(
                    "this viewer needs its token: open the URL `rollouts view` printed when it started", 401
                )
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
