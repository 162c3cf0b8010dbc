"""HTML -> readable text with numbered links, using only the standard library's html.parser.

Scripts, styles and other invisible elements are dropped; headings become `#` lines, list
items `- ` lines, and each link's text is followed by `[n]`, where n indexes `links`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "object"})
_BLOCK = frozenset(
    {
        "p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "form", "table",
        "tr", "ul", "ol", "dl", "dt", "dd", "blockquote", "figure", "figcaption", "hr", "br", "h1", "h2",
        "h3", "h4", "h5", "h6", "li", "pre", "address", "details", "summary",
    }
)  # fmt: skip
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "wbr"})


@dataclass(frozen=True)
class Link:
    text: str
    url: str


@dataclass(frozen=True)
class Page:
    title: str
    text: str
    links: tuple[Link, ...]


class _Converter(HTMLParser):
    def __init__(self, base_url: str, max_links: int) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.max_links = max_links
        self.out: list[str] = []
        self.links: list[Link] = []
        self.title = ""
        self._skip_depth = 0
        self._in_title = False
        self._pre = 0
        self._link_href: str | None = None
        self._link_text: list[str] = []
        self._seen: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "title":
            self._in_title = True
            return
        if tag == "base" and a.get("href"):
            self.base_url = urljoin(self.base_url, a["href"] or "")
        if tag in _SKIP:
            if tag not in _VOID:
                self._skip_depth += 1
            return
        if self._skip_depth:
            return
        if tag in _BLOCK:
            self.out.append("\n")
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.out.append("#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.append("- ")
        elif tag == "pre":
            self._pre += 1
        elif tag in ("td", "th"):
            self.out.append(" | ")
        elif tag == "img" and a.get("alt"):
            self.out.append(f"[image: {a['alt']}]")
        elif tag == "a" and a.get("href"):
            self._link_href = a["href"]
            self._link_text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if tag in _SKIP:
            if tag not in _VOID and self._skip_depth:
                self._skip_depth -= 1
            return
        if self._skip_depth:
            return
        if tag == "a" and self._link_href is not None:
            self._finish_link()
        if tag == "pre" and self._pre:
            self._pre -= 1
        if tag in _BLOCK:
            self.out.append("\n")

    def _finish_link(self) -> None:
        href = (self._link_href or "").strip()
        self._link_href = None
        text = " ".join("".join(self._link_text).split())
        url = urljoin(self.base_url, href)
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            return  # mailto:, javascript:, ... are not followable
        url = url.split("#", 1)[0] or url
        n = self._seen.get(url)
        if n is None:
            if len(self.links) >= self.max_links:
                return
            self.links.append(Link(text or url, url))
            n = self._seen[url] = len(self.links)
        self.out.append(f" [{n}]")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
            return
        if self._skip_depth:
            return
        if self._link_href is not None:
            self._link_text.append(data)
        if self._pre:
            self.out.append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))


# A '<' whose next angle bracket is another '<' (or none) cannot start a tag. html.parser
# rescans from every such '<' to the end of the document, which is quadratic: 24 KB of '<a '
# takes seconds, a 2 MB page hours. Escaped first, the parse stays linear.
_UNCLOSED_LT = re.compile(r"<(?=[^<>]*(?:<|\Z))")


def _without_comments(html: str) -> str:
    """`html` with its comments removed (an unclosed one runs to the end), in linear time."""
    parts: list[str] = []
    pos = 0
    while (start := html.find("<!--", pos)) != -1:
        parts.append(html[pos:start])
        end = html.find("-->", start + 4)
        if end == -1:
            return "".join(parts)
        pos = end + 3
    parts.append(html[pos:])
    return "".join(parts)


def defuse(html: str) -> str:
    """`html` made safe for html.parser in linear time: comments dropped, stray '<' escaped."""
    return _UNCLOSED_LT.sub("&lt;", _without_comments(html))


def html_to_page(html: str, base_url: str, *, max_links: int = 500) -> Page:
    """Readable text and numbered links of an HTML document (linear in its size)."""
    conv = _Converter(base_url, max_links)
    conv.feed(defuse(html))
    conv.close()
    if conv._link_href is not None:
        conv._finish_link()
    raw = "".join(conv.out)
    lines = [line.strip() for line in raw.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return Page(" ".join(conv.title.split()), text, tuple(conv.links))
