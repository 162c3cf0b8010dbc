"""BrowsingEnvironment against a small site served by the test on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
import trio
from _env_helpers import run, tool_messages

from rollouts import RunConfig, ToolCall
from rollouts.environments import BrowsingEnvironment, SearchResult, check_environment
from rollouts.environments.base import clone_environment
from rollouts.providers.scripted import tool_call

INDEX = """<!doctype html><html><head><title>Test  Site</title>
<style>body { color: red }</style><script>var secret = "do-not-show";</script></head>
<body><h1>Welcome</h1><p>This site has <a href="/a">page A</a> and <a href="b.html">page B</a>.</p>
<ul><li>first item</li><li>second item with a <a href="https://elsewhere.example/x">far link</a></li></ul>
<p><a href="mailto:x@example.com">mail</a> <a href="/a#top">page A again</a></p>
<pre>code  block</pre></body></html>"""

PAGE_A = "<html><head><title>Page A</title></head><body><p>Alpha content. The answer is 42.</p><a href='/'>home</a></body></html>"
PAGE_B = "<html><body><h2>Bee</h2><p>Buzz.</p></body></html>"


class _Handler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, str, bytes, dict[str, str]]]] = {}

    def do_GET(self) -> None:
        path = self.path
        if path == "/slow":
            time.sleep(3)
        if path.startswith("/loop"):
            self._send(302, "text/plain", b"", {"Location": f"/loop{len(path)}"})
            return
        status, ctype, body, headers = self.routes.get(path, (404, "text/html", b"<p>no such page</p>", {}))
        self._send(status, ctype, body, headers)

    def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.block_on_close = False
    base = f"http://127.0.0.1:{server.server_address[1]}"
    html = "text/html; charset=utf-8"
    _Handler.routes = {
        "/": (200, html, INDEX.encode(), {}),
        "/a": (200, html, PAGE_A.encode(), {}),
        "/b.html": (200, html, PAGE_B.encode(), {}),
        "/data.json": (200, "application/json", b'{"name": "rollouts", "tags": ["a", "b"]}', {}),
        "/plain.txt": (200, "text/plain; charset=utf-8", "caf\u00e9 plain text\n".encode(), {}),
        "/image.png": (200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, {}),
        "/latin1.txt": (200, "text/plain; charset=iso-8859-1", "caf\u00e9".encode("latin-1"), {}),
        "/bogus.txt": (200, "text/plain; charset=no-such-charset", b"plain bytes", {}),
        "/go-a": (302, "text/plain", b"", {"Location": "/a"}),
        "/to-localhost": (302, "text/plain", b"", {"Location": base.replace("127.0.0.1", "localhost") + "/a"}),
        "/big": (200, html, b"<html><body><p>" + b"lorem ipsum " * 400_000 + b"</p></body></html>", {}),
        "/long": (200, "text/plain", ("\n".join(f"row {i}" for i in range(5000))).encode(), {}),
    }
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield base
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def _call(env: BrowsingEnvironment, name: str, **args: Any):
    return await env.exec_tool(ToolCall("c1", name, args), None, RunConfig())  # type: ignore[arg-type]


async def test_fetch_turns_html_into_text_with_numbered_links(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    r = await _call(env, "fetch", url=site + "/")
    assert not r.is_error, r.content
    text = r.content
    assert text.startswith(f"Title: Test Site\nURL: {site}/")
    assert "# Welcome" in text and "- first item" in text
    assert "page A [1]" in text and "page B [2]" in text and "far link [3]" in text
    assert "page A again [1]" in text  # same URL (fragment dropped) keeps its number
    assert "do-not-show" not in text and "color: red" not in text and "mailto" not in text
    assert f"[1] page A -> {site}/a" in text and f"[2] page B -> {site}/b.html" in text
    assert "[3] far link -> https://elsewhere.example/x" in text
    assert env.title == "Test Site" and len(env.links) == 3


async def test_follow_link_find_in_page_and_back(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    await _call(env, "fetch", url=site + "/")
    r = await _call(env, "follow_link", n=1)
    assert "Title: Page A" in r.content and "The answer is 42." in r.content
    r = await _call(env, "find_in_page", text="ANSWER")
    assert "1 matching line" in r.content and "The answer is 42." in r.content
    assert "does not occur" in (await _call(env, "find_in_page", text="zebra")).content
    r = await _call(env, "follow_link", n=9)
    assert r.is_error and "no link 9" in r.content
    r = await _call(env, "back")
    assert "Title: Test Site" in r.content and env.history == [site + "/"]
    r = await _call(env, "follow_link", n=3)  # a host outside the allow list
    assert r.is_error and "'elsewhere.example' is not on this environment's allow list" in r.content


async def test_host_allow_and_deny_lists(site: str) -> None:
    port = site.rsplit(":", 1)[1]
    r = await _call(
        BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True),
        "fetch",
        url=f"http://localhost:{port}/a",
    )
    assert r.is_error and "not on this environment's allow list" in r.content
    r = await _call(BrowsingEnvironment(deny_hosts=["127.0.0.*"]), "fetch", url=site + "/a")
    assert r.is_error and "deny list" in r.content
    r = await _call(
        BrowsingEnvironment(allow_hosts=[f"127.0.0.1:{port}"], allow_private_addresses=True), "fetch", url=site + "/a"
    )
    assert not r.is_error
    r = await _call(BrowsingEnvironment(allow_hosts=["127.0.0.1:1"]), "fetch", url=site + "/a")
    assert r.is_error
    r = await _call(BrowsingEnvironment(), "fetch", url="file:///etc/passwd")
    assert r.is_error and "Only http and https" in r.content
    # A redirect is checked too: the allowed host cannot bounce the browser to another host.
    r = await _call(
        BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True),
        "fetch",
        url=site + "/to-localhost",
    )
    assert r.is_error and "'localhost' is not on this environment's allow list" in r.content


async def test_redirects_are_followed_up_to_the_limit(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True, max_redirects=3)
    r = await _call(env, "fetch", url=site + "/go-a")
    assert not r.is_error and env.url == site + "/a" and "Alpha content" in r.content
    r = await _call(env, "fetch", url=site + "/loop")
    assert r.is_error and "Too many redirects (more than 3)" in r.content


async def test_content_types(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    r = await _call(env, "fetch", url=site + "/data.json")
    assert not r.is_error and '"name": "rollouts"' in r.content and '  "tags": [' in r.content
    r = await _call(env, "fetch", url=site + "/plain.txt")
    assert not r.is_error and "caf\u00e9 plain text" in r.content
    r = await _call(env, "fetch", url=site + "/latin1.txt")
    assert not r.is_error and "caf\u00e9" in r.content
    r = await _call(env, "fetch", url=site + "/bogus.txt")
    assert not r.is_error and "plain bytes" in r.content
    r = await _call(env, "fetch", url=site + "/image.png")
    assert r.is_error and "'image/png'" in r.content and "text/html, text/plain and JSON" in r.content
    r = await _call(env, "fetch", url=site + "/missing")
    assert r.is_error and "HTTP 404" in r.content and "no such page" in r.content


async def test_size_caps_and_paging(site: str) -> None:
    env = BrowsingEnvironment(
        allow_hosts=["127.0.0.1"], allow_private_addresses=True, max_bytes=50_000, view_chars=2_000
    )
    r = await _call(env, "fetch", url=site + "/big")
    assert not r.is_error
    assert "larger than 50000 bytes" in env.text and len(env.text) < 52_000
    assert len(r.content) < 2_400 and "Use read_page(offset=2000)" in r.content
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True, view_chars=500)
    await _call(env, "fetch", url=site + "/long")
    hit = (await _call(env, "find_in_page", text="row 4321")).content
    offset = int(hit.split("(offset ")[1].split(")")[0])
    r = await _call(env, "read_page", offset=offset)
    assert "row 4321" in r.content.splitlines()[2]


async def test_timeout_is_a_clear_error(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True, timeout=0.3)
    r = await _call(env, "fetch", url=site + "/slow")
    assert r.is_error and "Timed out" in r.content


class _ListSearch:
    """A search backend over a fixed list of results (serializable)."""

    def __init__(self, results: Sequence[Sequence[str]]) -> None:
        self.results = [list(r) for r in results]

    async def search(self, query: str, max_results: int) -> Sequence[SearchResult]:
        return [SearchResult(t, u, s) for t, u, s in self.results if query.lower() in (t + s).lower()][:max_results]

    def serialize(self) -> dict[str, Any]:
        return {"results": self.results}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> _ListSearch:
        return cls(data["results"])


async def test_search_is_absent_by_default_and_pluggable(site: str) -> None:
    assert "search" not in [t.name for t in BrowsingEnvironment().get_tools()]
    r = await _call(BrowsingEnvironment(), "search", query="x")
    assert r.is_error and "Unknown tool" in r.content
    backend = _ListSearch([["Page A", site + "/a", "alpha page"], ["Bee", site + "/b.html", "buzz"]])
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True, search=backend)
    assert "search" in [t.name for t in env.get_tools()]
    r = await _call(env, "search", query="alpha")
    assert r.content == f"1. Page A\n   {site}/a\n   alpha page"
    clone = await check_environment(env, calls=[ToolCall("1", "search", {"query": "buzz"})])
    assert isinstance(clone, BrowsingEnvironment) and isinstance(clone.search_backend, _ListSearch)


async def test_agent_browses_and_the_page_survives_a_round_trip_mid_run(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    first = await run(env, [tool_call("fetch", url=site + "/"), "looked"], prompt="What is the answer on page A?")
    mid = first[-1]
    assert mid.environment is not None
    data = json.loads(json.dumps(await mid.environment.serialize()))
    assert data["url"] == site + "/" and data["links"][0] == ["page A", site + "/a"]
    restored = await BrowsingEnvironment.deserialize(data)
    await check_environment(restored)
    second = await run(
        restored, [tool_call("follow_link", n=1), tool_call("find_in_page", text="answer"), "42"], state=mid
    )
    msgs = tool_messages(second[-1])
    assert [m.details["tool_name"] for m in msgs] == ["fetch", "follow_link", "find_in_page"]  # type: ignore[index]
    assert "The answer is 42." in msgs[-1].text
    final = second[-1].environment
    assert isinstance(final, BrowsingEnvironment) and final.history == [site + "/", site + "/a"]
    again = await clone_environment(final)
    assert await again.serialize() == await final.serialize()


async def test_back_keeps_history_when_the_page_is_gone(site: str) -> None:
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    await _call(env, "fetch", url=site + "/b.html")
    await _call(env, "fetch", url=site + "/a")
    _Handler.routes.pop("/b.html")
    r = await _call(env, "back")
    assert r.is_error and "HTTP 404" in r.content
    assert env.history == [site + "/b.html", site + "/a"] and env.url == site + "/a"
    r = await _call(BrowsingEnvironment(), "back")
    assert r.is_error and "no previous page" in r.content


def test_html_without_closing_head_tag_keeps_its_body() -> None:
    from rollouts.environments._html import html_to_page

    page = html_to_page(
        "<html><head><title>T</title><meta charset=utf-8><body><p>Hello <a href=/x>there</a><br>next"
        "<table><tr><td>a<td>b</table><img alt=pic src=a.png><a href='javascript:void(0)'>js</a>",
        "http://h/dir/",
    )
    assert page.title == "T"
    assert page.text == "Hello there [1]\nnext\n\n| a | b\n[image: pic]js"
    assert [(link.text, link.url) for link in page.links] == [("there", "http://h/x")]


def test_malformed_html_parses_in_linear_time() -> None:
    """html.parser alone is quadratic on unclosed tags ('<a ' * 20000 took ~30 s); defused, the
    worst inputs stay fast and their text is kept."""
    import time

    from rollouts.environments._html import html_to_page

    for html in ("<a " * 20_000, "<" * 200_000, "<!--" * 50_000, "<p>" + "x<y " * 50_000):
        t0 = time.thread_time()  # CPU time: the machine's load does not count, a quadratic parse does
        page = html_to_page(html, "http://h/")
        assert time.thread_time() - t0 < 2.0, html[:10]
        assert page.text == html.replace("<!--", "").removeprefix("<p>").strip()
    page = html_to_page("<p>a < b, c<d</p><!-- hidden <x> --><a title='q>r' href=/z>link</a>", "http://h/")
    assert page.text == "a < b, c<d\nlink [1]" and page.links[0].url == "http://h/z"


async def test_a_hostile_page_is_fetched_and_read_quickly(site: str) -> None:
    _Handler.routes["/hostile"] = (200, "text/html", b"<html><body>" + b"<a " * 200_000, {})
    env = BrowsingEnvironment(allow_hosts=["127.0.0.1"], allow_private_addresses=True)
    with trio.fail_after(10):
        r = await _call(env, "fetch", url=site + "/hostile")
    assert not r.is_error and r.content.count("<a") > 100


# ---- item 7: only public addresses unless allowed ---------------------------------------------


async def test_item7_private_and_local_addresses_are_refused_by_default(site: str) -> None:
    port = site.rsplit(":", 1)[1]
    env = BrowsingEnvironment()  # no allow list: anything public, nothing else
    for url, kind in (
        (site + "/a", "loopback"),
        (f"http://localhost:{port}/a", "loopback"),  # refused after DNS resolution
        (f"http://2130706433:{port}/a", "loopback"),  # 127.0.0.1 spelled as a number
        (f"http://[::1]:{port}/a", "loopback"),
        (f"http://[::ffff:127.0.0.1]:{port}/a", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://0.0.0.0/", "unspecified"),
    ):
        r = await _call(env, "fetch", url=url)
        assert r.is_error and kind in r.content, (url, r.content)
        assert "BrowsingEnvironment(allow_private_addresses=True)" in r.content
    assert env.url is None and env.history == []
    # the explicit opt-in (with or without an allow list), kept through serialize/deserialize
    opted = BrowsingEnvironment(allow_private_addresses=True)
    assert not (await _call(opted, "fetch", url=f"http://localhost:{port}/a")).is_error
    restored = await BrowsingEnvironment.deserialize(json.loads(json.dumps(await opted.serialize())))
    assert restored.allow_private_addresses and not (await _call(restored, "fetch", url=site + "/a")).is_error


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host names the browser's backend resolves to given addresses, counting every lookup, and
    127.0.0.1 treated as a public address, so the test server stands for a public site."""
    from rollouts.environments import _addresses

    table: dict[str, list[str]] = {}
    lookups: list[str] = []
    real_kind = _addresses.address_kind

    async def resolve(self: object, host: str, port: int) -> list[str]:
        lookups.append(host)
        return list(table[host])

    monkeypatch.setattr(_addresses.PublicOnlyBackend, "_resolve", resolve)
    monkeypatch.setattr(_addresses, "address_kind", lambda a: None if a == "127.0.0.1" else real_kind(a))
    table["lookups"] = lookups  # type: ignore[assignment]
    return table


async def test_item7_every_redirect_hop_is_checked_after_resolution(site: str, fake_dns: dict[str, list[str]]) -> None:
    port = site.rsplit(":", 1)[1]
    fake_dns["public.test"] = ["127.0.0.1"]
    fake_dns["internal.test"] = ["10.0.0.5"]
    fake_dns["mixed.test"] = ["127.0.0.1", "192.168.1.9"]
    _Handler.routes["/to-internal"] = (302, "text/plain", b"", {"Location": f"http://internal.test:{port}/a"})
    _Handler.routes["/to-metadata"] = (302, "text/plain", b"", {"Location": "http://169.254.169.254/latest/"})
    env = BrowsingEnvironment()
    r = await _call(env, "fetch", url=f"http://public.test:{port}/a")
    assert not r.is_error and "The answer is 42." in r.content  # a public site is fetched
    r = await _call(env, "fetch", url=f"http://public.test:{port}/to-internal")
    assert r.is_error and "internal.test (it resolves to 10.0.0.5): a private address" in r.content
    r = await _call(env, "fetch", url=f"http://public.test:{port}/to-metadata")
    assert r.is_error and "169.254.169.254: a link-local address" in r.content
    r = await _call(env, "fetch", url=f"http://mixed.test:{port}/a")  # one private address is enough
    assert r.is_error and "mixed.test (it resolves to 192.168.1.9): a private address" in r.content


async def test_item7_the_connection_goes_to_the_address_checked(site: str, fake_dns: dict[str, list[str]]) -> None:
    """DNS rebinding: a name that resolves to a public address when checked and to a private one
    a moment later. The browser resolves once per connection and connects to what it checked:
    the system resolver, which does not know `rebind.test`, is never asked."""
    port = site.rsplit(":", 1)[1]
    fake_dns["rebind.test"] = ["127.0.0.1"]
    r = await _call(BrowsingEnvironment(), "fetch", url=f"http://rebind.test:{port}/a")
    assert not r.is_error and "The answer is 42." in r.content, r.content
    assert fake_dns["lookups"] == ["rebind.test"]
