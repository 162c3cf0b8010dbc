"""Message text as HTML: Markdown for what models and people write, ANSI colours for tool output.

Both are safe for any input. Markdown goes through markdown-it-py (the CommonMark reference
parser's Python port) with raw HTML off, so `<script>` or `<img onerror=...>` in a message is
shown as text, never parsed; links keep only http(s), mailto and relative targets (markdown-it
drops `javascript:`, `vbscript:`, `file:` and `data:`), and images are shown as links (the
Content-Security-Policy would not load another site's image anyway). ANSI SGR codes (colours,
bold) become spans with classes (the CSP forbids inline styles); every other escape sequence
is dropped. The text is HTML-escaped before any markup is added.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from markupsafe import Markup, escape

__all__ = ["ansi_html", "has_ansi", "markdown_html"]

_SGR = re.compile(r"\x1b\[([0-9;]*)m")
_OTHER_ESCAPES = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_MD_LIMIT = 200_000  # longer texts are shown as they are (a page cuts parts at 20,000 characters anyway)


def has_ansi(text: str) -> bool:
    return "\x1b[" in text


def ansi_html(text: str) -> Markup:
    """`text` escaped, its SGR colour codes as `<span class="ansi-...">`."""
    out: list[str] = []
    classes: list[str] = []
    pos = 0
    open_span = False
    for m in _SGR.finditer(text):
        out.append(str(escape(_OTHER_ESCAPES.sub("", text[pos : m.start()]))))
        pos = m.end()
        classes = _apply_sgr(classes, m.group(1))
        if open_span:
            out.append("</span>")
            open_span = False
        if classes:
            out.append(f'<span class="{" ".join(classes)}">')
            open_span = True
    out.append(str(escape(_OTHER_ESCAPES.sub("", text[pos:]))))
    if open_span:
        out.append("</span>")
    return Markup("".join(out))


def _apply_sgr(classes: list[str], params: str) -> list[str]:
    fg = next((c for c in classes if c.startswith("ansi-fg")), None)
    bg = next((c for c in classes if c.startswith("ansi-bg")), None)
    bold = "ansi-bold" in classes
    for raw in (params or "0").split(";")[:16]:
        code = int(raw) if raw.isdigit() and len(raw) <= 3 else -1
        if code == 0:
            fg = bg = None
            bold = False
        elif code == 1:
            bold = True
        elif code == 22:
            bold = False
        elif 30 <= code <= 37 or 90 <= code <= 97:
            fg = f"ansi-fg{code}"
        elif code == 39:
            fg = None
        elif 40 <= code <= 47 or 100 <= code <= 107:
            bg = f"ansi-bg{code}"
        elif code == 49:
            bg = None
    return [c for c in (fg, bg, "ansi-bold" if bold else None) if c]


@functools.cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    md.enable("strikethrough")

    def image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        src = token.attrGet("src") or ""
        alt = self.renderInlineAsText(token.children or [], options, env)
        return f'<a href="{escape(src)}" class="image-link">[image: {escape(alt)}]</a>'

    md.add_render_rule("image", image)
    return md


def markdown_html(text: str) -> Markup:
    """`text` as sanitised Markdown HTML (see the module docstring)."""
    if len(text) > _MD_LIMIT:
        return Markup('<div class="text">{}</div>').format(text)
    return Markup('<div class="md">{}</div>').format(Markup(_markdown().render(text)))
