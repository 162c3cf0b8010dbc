"""BrowsingEnvironment: fetch pages as readable text, follow numbered links, search within a page.

No JavaScript: pages are fetched with httpx2 and HTML is turned into text with the standard
library's parser, links listed and numbered. Every request (and every redirect hop) is checked
against the host allow/deny lists and, after DNS resolution, against the address: only public
addresses are reached (not 127.0.0.1, 10.x, 169.254.169.254, ...) unless
`allow_private_addresses=True`, and the connection goes to the address checked (see
`_addresses.py`); responses are capped in time (`timeout`), size (`max_bytes`)
and redirects (`max_redirects`). text/html, text/plain and JSON are read; other content types
are refused with a clear message. A `search` tool exists only when a `SearchBackend` is given.

The current page (url, title, text, links) and the history are the state `serialize()` keeps.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urljoin, urlsplit

import trio

from rollouts.environments._addresses import address_kind, blocked, guarded_transport, is_ip_literal
from rollouts.environments._html import Link, html_to_page
from rollouts.environments.base import environment_type_name, load_environment_class
from rollouts.environments.tools import ToolEnvironment, ToolError, tool

if TYPE_CHECKING:
    from typing import Self

    import httpx2

__all__ = ["BrowsingEnvironment", "SearchBackend", "SearchResult"]

_USER_AGENT = "rollouts-browser/0.1 (+no-javascript)"
_SHOWN_LINKS = 100
_FIND_MAX = 30


@dataclass(frozen=True)
class SearchResult:
    """One hit of a search backend."""

    title: str
    url: str
    snippet: str = ""


@runtime_checkable
class SearchBackend(Protocol):
    """A web search the `search` tool calls. It must serialize (no secrets: read keys from the
    environment) so the BrowsingEnvironment holding it can be cloned and resumed."""

    async def search(self, query: str, max_results: int) -> Sequence[SearchResult]: ...

    def serialize(self) -> dict[str, Any]: ...

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> Self: ...


def _host_matches(host: str, port: int | None, pattern: str) -> bool:
    pattern = pattern.lower().strip()
    if ":" in pattern and not pattern.startswith("["):
        return port is not None and fnmatch.fnmatchcase(f"{host}:{port}", pattern)
    if pattern.startswith("."):
        return host == pattern[1:] or host.endswith(pattern)
    return fnmatch.fnmatchcase(host, pattern)


class BrowsingEnvironment(ToolEnvironment):
    """A text-only web browser for the model.

    Args:
        allow_hosts: if given, only these hosts may be fetched. Patterns: `example.com`,
            `*.example.com` (subdomains), `.example.com` (both), `127.0.0.1:8080` (host:port).
        deny_hosts: hosts never fetched (checked first, same patterns).
        allow_private_addresses: also fetch from non-public addresses: loopback (127.0.0.1,
            localhost), private networks (10.x, 172.16-31.x, 192.168.x, fc00::/7), link-local
            (169.254.x, where cloud metadata services answer) and other reserved ranges. Off by
            default: a host, or a redirect, leading to such an address is refused after DNS
            resolution. Turn it on only for servers you run for the model (e.g. in tests).
        search: a SearchBackend; without one there is no `search` tool.
        timeout: seconds allowed for one fetch, redirects included.
        max_bytes: bytes of a response body read; the rest is dropped (and said so).
        max_redirects: redirects followed per fetch.
        view_chars: characters of page text shown per tool result (read_page shows more).
        max_links: links kept per page.
    """

    def __init__(
        self,
        *,
        allow_hosts: Sequence[str] | None = None,
        deny_hosts: Sequence[str] = (),
        allow_private_addresses: bool = False,
        search: SearchBackend | None = None,
        timeout: float = 20.0,
        max_bytes: int = 2_000_000,
        max_redirects: int = 5,
        view_chars: int = 8_000,
        max_links: int = 300,
        max_history: int = 50,
        url: str | None = None,
        title: str = "",
        text: str = "",
        links: Sequence[Sequence[str]] = (),
        history: Sequence[str] = (),
        content_type: str = "",
    ) -> None:
        if timeout <= 0 or max_bytes <= 0 or max_redirects < 0 or view_chars <= 0:
            raise ValueError("timeout, max_bytes and view_chars must be > 0 and max_redirects >= 0")
        self.allow_hosts = tuple(allow_hosts) if allow_hosts is not None else None
        self.deny_hosts = tuple(deny_hosts)
        self.allow_private_addresses = bool(allow_private_addresses)
        self.search_backend = search
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self.max_redirects = int(max_redirects)
        self.view_chars = int(view_chars)
        self.max_links = int(max_links)
        self.max_history = int(max_history)
        self.url = url
        self.title = title
        self.text = text
        self.links = tuple(Link(t, u) for t, u in links)
        self.history = list(history)
        self.content_type = content_type

    # ---- protocol -------------------------------------------------------------------------

    def enabled_tools(self) -> Sequence[str]:
        names = ["fetch", "follow_link", "find_in_page", "read_page", "back"]
        if self.search_backend is not None:
            names.append("search")
        return names

    def get_status_info(self) -> dict[str, str]:
        return {"url": self.url or "(no page)", "title": self.title}

    async def serialize(self) -> dict[str, Any]:
        backend = None
        if self.search_backend is not None:
            backend = {
                "type": environment_type_name(type(self.search_backend)),
                "state": self.search_backend.serialize(),
            }
        return {
            "allow_hosts": list(self.allow_hosts) if self.allow_hosts is not None else None,
            "deny_hosts": list(self.deny_hosts),
            "allow_private_addresses": self.allow_private_addresses,
            "search": backend,
            "timeout": self.timeout,
            "max_bytes": self.max_bytes,
            "max_redirects": self.max_redirects,
            "view_chars": self.view_chars,
            "max_links": self.max_links,
            "max_history": self.max_history,
            "url": self.url,
            "title": self.title,
            "text": self.text,
            "links": [[link.text, link.url] for link in self.links],
            "history": list(self.history),
            "content_type": self.content_type,
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        data = dict(data)
        backend = data.pop("search", None)
        search = None
        if backend is not None:
            backend_cls: Any = load_environment_class(backend["type"])
            search = backend_cls.deserialize(backend["state"])
        return cls(search=search, **data)

    # ---- fetching -------------------------------------------------------------------------

    def check_url(self, url: str) -> str:
        """`url` if it may be fetched, else ToolError saying why."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ToolError(f"Only http and https URLs can be fetched, got {url!r}.")
        host = (parts.hostname or "").lower()
        if not host:
            raise ToolError(f"The URL {url!r} has no host.")
        try:
            port = parts.port
        except ValueError:
            raise ToolError(f"The URL {url!r} has an invalid port.") from None
        if any(_host_matches(host, port, p) for p in self.deny_hosts):
            raise ToolError(f"Access to host {host!r} is blocked by this environment's deny list.")
        if self.allow_hosts is not None and not any(_host_matches(host, port, p) for p in self.allow_hosts):
            allowed = ", ".join(self.allow_hosts) or "(none)"
            raise ToolError(f"Host {host!r} is not on this environment's allow list ({allowed}).")
        if not self.allow_private_addresses and is_ip_literal(host):
            kind = address_kind(host)
            if kind is not None:
                raise blocked(host, host, kind)
        return url

    async def _get(self, url: str) -> tuple[str, str, str, bool]:
        """(final url, kind, decoded body, truncated) after redirects, with every hop checked."""
        import httpx2  # imported on first use: `import rollouts` stays fast

        timeout = httpx2.Timeout(self.timeout)
        headers = {"User-Agent": _USER_AGENT, "Accept": "text/html, text/plain, application/json;q=0.9, */*;q=0.1"}
        with trio.move_on_after(self.timeout) as overall:
            async with httpx2.AsyncClient(
                timeout=timeout,
                follow_redirects=False,
                headers=headers,
                trust_env=False,
                transport=guarded_transport(allow_private=self.allow_private_addresses),
            ) as client:
                for _ in range(self.max_redirects + 1):
                    self.check_url(url)
                    try:
                        async with client.stream("GET", url) as resp:
                            location = resp.headers.get("location")
                            if resp.status_code in (301, 302, 303, 307, 308) and location:
                                url = urljoin(url, location)
                                continue
                            return await self._read(url, resp)
                    except httpx2.TimeoutException:
                        raise ToolError(f"Timed out fetching {url} (limit {self.timeout:g}s).") from None
                    except httpx2.HTTPError as e:
                        raise ToolError(f"Could not fetch {url}: {type(e).__name__}: {e}") from None
                raise ToolError(f"Too many redirects (more than {self.max_redirects}); the last one pointed to {url}.")
        assert overall.cancelled_caught
        raise ToolError(f"Timed out fetching {url} (limit {self.timeout:g}s including redirects).")

    async def _read(self, url: str, resp: httpx2.Response) -> tuple[str, str, str, bool]:
        ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype in ("text/html", "application/xhtml+xml"):
            kind = "html"
        elif ctype == "application/json" or ctype.endswith("+json"):
            kind = "json"
        elif ctype in ("text/plain", "text/markdown", "text/csv", "") or (
            ctype.startswith("text/") and ctype != "text/html"
        ):
            kind = "text"
        else:
            raise ToolError(
                f"{url} has content type {ctype!r}, which this browser does not read "
                "(it reads text/html, text/plain and JSON)."
            )
        body = bytearray()
        truncated = False
        async for chunk in resp.aiter_bytes():
            body += chunk
            if len(body) > self.max_bytes:
                del body[self.max_bytes :]
                truncated = True
                break
        try:
            text = bytes(body).decode(resp.charset_encoding or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know: read it as UTF-8
            text = bytes(body).decode("utf-8", errors="replace")
        if resp.status_code >= 400:
            snippet = " ".join(text.split())[:300]
            raise ToolError(f"HTTP {resp.status_code} {resp.reason_phrase} for {url}. {snippet}".strip())
        return url, kind, text, truncated

    async def _open(self, url: str) -> str:
        final, kind, body, truncated = await self._get(self.check_url(url.strip()))
        if kind == "html":
            # Off the event loop: a 2 MB page takes a second or two to parse.
            page = await trio.to_thread.run_sync(
                functools.partial(html_to_page, body, final, max_links=self.max_links), abandon_on_cancel=True
            )
            title, text, links = page.title, page.text, page.links
        elif kind == "json":
            try:
                text = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
            except ValueError:
                text = body
            title, links = "", ()
        else:
            title, text, links = "", body, ()
        if truncated:
            text += f"\n\n[The response was larger than {self.max_bytes} bytes; the rest was not read.]"
        self.url, self.title, self.text, self.links, self.content_type = final, title, text, links, kind
        self.history = (self.history + [final])[-self.max_history :]
        return self._view(0)

    def _view(self, offset: int) -> str:
        assert self.url is not None
        head = [f"URL: {self.url}"]
        if self.title:
            head.insert(0, f"Title: {self.title}")
        end = min(len(self.text), offset + self.view_chars)
        body = self.text[offset:end]
        parts = ["\n".join(head), body]
        if end < len(self.text):
            parts.append(
                f"[Showing characters {offset}-{end} of {len(self.text)}. "
                f"Use read_page(offset={end}) for more, or find_in_page.]"
            )
        if self.links:
            shown = self.links[:_SHOWN_LINKS]
            lines = [f"[{i}] {link.text} -> {link.url}" for i, link in enumerate(shown, 1)]
            more = f" (first {_SHOWN_LINKS} of {len(self.links)})" if len(self.links) > _SHOWN_LINKS else ""
            parts.append(f"Links{more}; open one with follow_link(n):\n" + "\n".join(lines))
        return "\n\n".join(p for p in parts if p)

    def _need_page(self) -> None:
        if self.url is None:
            raise ToolError("No page is open yet; call fetch(url) first.")

    # ---- tools ----------------------------------------------------------------------------

    @tool
    async def fetch(self, url: str) -> str:
        """Open a web page (http or https) and show its text with numbered links.

        Args:
            url: The full URL, e.g. https://example.com/page.
        """
        return await self._open(url)

    @tool
    async def follow_link(self, n: int) -> str:
        """Open link number `n` of the current page (the numbers shown in [brackets]).

        Args:
            n: The link number.
        """
        self._need_page()
        if not 1 <= n <= len(self.links):
            raise ToolError(f"There is no link {n} on this page; it has {len(self.links)} links (1-{len(self.links)}).")
        return await self._open(self.links[n - 1].url)

    @tool
    async def find_in_page(self, text: str) -> str:
        """Find lines of the current page containing `text` (case-insensitive).

        Args:
            text: The text to look for.
        """
        self._need_page()
        needle = text.lower().strip()
        if not needle:
            raise ToolError("Give some text to find.")
        hits: list[str] = []
        offset = 0
        total = 0
        for n, line in enumerate(self.text.split("\n"), 1):
            if needle in line.lower():
                total += 1
                if len(hits) < _FIND_MAX:
                    hits.append(f"line {n} (offset {offset}): {line[:400]}")
            offset += len(line) + 1
        if not hits:
            return f"{text!r} does not occur on {self.url}."
        more = f"\n[{total - _FIND_MAX} more matches not shown]" if total > _FIND_MAX else ""
        return f"{total} matching line{'s' if total != 1 else ''} on {self.url}:\n" + "\n".join(hits) + more

    @tool
    async def read_page(self, offset: int = 0) -> str:
        """Show the current page's text from a character offset (for long pages).

        Args:
            offset: Character offset to start from.
        """
        self._need_page()
        if not 0 <= offset < max(1, len(self.text)):
            raise ToolError(f"offset must be between 0 and {max(0, len(self.text) - 1)}.")
        return self._view(offset)

    @tool
    async def back(self) -> str:
        """Go back to the previous page (it is fetched again)."""
        if len(self.history) < 2:
            raise ToolError("There is no previous page to go back to.")
        saved = list(self.history)
        self.history = saved[:-2]
        try:
            return await self._open(saved[-2])
        except BaseException:  # restore on any failure (cancellation included), then re-raise
            self.history = saved
            raise

    @tool
    async def search(self, query: str, max_results: int = 8) -> str:
        """Search the web; returns titles, URLs and snippets to fetch.

        Args:
            query: What to search for.
            max_results: How many results to return (1-20).
        """
        if self.search_backend is None:
            raise ToolError("Search is not available in this environment.")
        results = await self.search_backend.search(query, max(1, min(20, max_results)))
        if not results:
            return f"No results for {query!r}."
        lines = [f"{i}. {r.title}\n   {r.url}\n   {r.snippet}".rstrip() for i, r in enumerate(results, 1)]
        return "\n".join(lines)
