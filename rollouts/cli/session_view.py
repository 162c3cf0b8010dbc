"""A stored session for people: terminal text, Markdown and HTML, and JSONL for programs.

Every content block is shown: text, thinking (redacted thinking as a marker), tool calls with
their arguments, tool results (errors marked), images as a one-line description.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from typing import Any

from rollouts.cli.render import _format_args, _one_line
from rollouts.dtypes import ImageContent, Message, TextContent, ThinkingContent, ToolCallContent, Usage
from rollouts.store import AgentSession

__all__ = ["preview", "to_html", "to_jsonl", "to_markdown", "to_text", "usage_line"]

_DIM, _RED, _CYAN, _BOLD, _RESET = "\x1b[2m", "\x1b[31m", "\x1b[36m", "\x1b[1m", "\x1b[0m"


def preview(messages: Sequence[Message], limit: int = 60) -> str:
    """The first user message on one line (what a session is about)."""
    first = next((m for m in messages if m.role == "user"), None)
    return _one_line(first.text, limit) if first is not None else ""


def usage_line(messages: Sequence[Message]) -> str:
    total = Usage()
    for m in messages:
        if m.usage is not None:
            total = total + m.usage
    text = f"{total.input_tokens} in / {total.output_tokens} out tokens"
    if total.cost_usd:
        text += f", ${total.cost_usd:.4f}"
    return text


def _image(block: ImageContent) -> str:
    if block.url is not None:
        return f"[image {block.url}]"
    return f"[image {block.media_type}, {len(block.data or '')} base64 characters]"


def _tool_name(message: Message) -> str:
    return message.tool_name or "tool"


def _is_error(message: Message) -> bool:
    return message.is_error


def _header_rows(session: AgentSession, messages: Sequence[Message]) -> list[tuple[str, str]]:
    ep = session.endpoint
    rows = [("status", session.status.value), ("model", f"{ep.provider}/{ep.model}")]
    if ep.api_base:
        rows.append(("api base", ep.api_base))
    if session.parent_id is not None:
        rows.append(("branch of", f"{session.parent_id} at message {session.branch_point}"))
    if session.environment_type:
        state = json.dumps(session.environment_state, ensure_ascii=False) if session.environment_state else ""
        rows.append(("environment", f"{session.environment_type} {_one_line(state, 100)}".rstrip()))
    if session.tags:
        rows.append(("tags", ", ".join(f"{k}={v}" for k, v in session.tags.items())))
    if session.reward is not None:
        rows.append(("reward", json.dumps(session.reward)))
    rows.append(("created", session.created_at))
    rows.append(("updated", session.updated_at))
    rows.append(("messages", f"{len(messages)}  ({usage_line(messages)})"))
    return rows


def _role_line(i: int, m: Message) -> str:
    extra = ""
    if m.role == "assistant":
        who = f"{m.provider}/{m.model}" if m.provider and m.model else ""
        usage = f"{m.usage.input_tokens} in, {m.usage.output_tokens} out" if m.usage else ""
        extra = "  ".join(x for x in (who, usage) if x)
        if m.details and m.details.get("aborted"):
            extra += "  (cut short: the turn was cancelled)"
    elif m.role == "tool":
        extra = _tool_name(m) + ("  error" if _is_error(m) else "")
    return f"[{i}] {m.role}" + (f"  {extra}" if extra else "")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else prefix.rstrip() for line in text.split("\n"))


# --------------------------------------------------------------------------------------------
# terminal text
# --------------------------------------------------------------------------------------------


def to_text(session: AgentSession, messages: Sequence[Message], *, color: bool = False, utf8: bool = True) -> str:
    def style(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    to, frm = ("→", "←") if utf8 else ("->", "<-")
    out = [style(f"session {session.session_id}", _BOLD)]
    out += [f"  {k:<12} {v}" for k, v in _header_rows(session, messages)]
    for i, m in enumerate(messages):
        out.append("")
        out.append(style(_role_line(i, m), _BOLD))
        if m.role == "tool":
            prefix = f"{frm} error: " if _is_error(m) else f"{frm} "
            out.append(style(_indent(prefix + m.text), _RED if _is_error(m) else ""))
            continue
        for block in m.blocks:
            if isinstance(block, TextContent):
                out.append(_indent(block.text))
            elif isinstance(block, ThinkingContent):
                text = "thinking (redacted)" if block.redacted else "thinking: " + block.thinking
                out.append(style(_indent(text), _DIM))
            elif isinstance(block, ToolCallContent):
                call = f"{to} {block.name}({_format_args(block.arguments, 400)})  [{block.id}]"
                if block.parse_error:
                    call += f"  (arguments were not valid JSON: {block.parse_error})"
                out.append(style(_indent(call), _CYAN))
            elif isinstance(block, ImageContent):
                out.append(_indent(_image(block)))
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _fence(text: str, info: str = "") -> str:
    """A fenced block longer than any backtick run inside `text`."""
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text}\n{ticks}"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _arguments_json(block: ToolCallContent) -> str:
    if block.parse_error and block.raw_arguments is not None:
        return block.raw_arguments
    return json.dumps(dict(block.arguments), ensure_ascii=False, indent=2)


def to_markdown(session: AgentSession, messages: Sequence[Message]) -> str:
    out = [f"# Session {session.session_id}", "", "| | |", "|---|---|"]
    out += [f"| {k} | {_md_cell(v)} |" for k, v in _header_rows(session, messages)]
    for i, m in enumerate(messages):
        out += ["", f"## {_role_line(i, m)}", ""]
        if m.role == "tool":
            out.append(("**error**\n\n" if _is_error(m) else "") + _fence(m.text))
            continue
        for block in m.blocks:
            if isinstance(block, TextContent):
                out += [block.text, ""]
            elif isinstance(block, ThinkingContent):
                text = "*(redacted)*" if block.redacted else block.thinking
                out += ["<details><summary>thinking</summary>", "", text, "", "</details>", ""]
            elif isinstance(block, ToolCallContent):
                out += [f"**tool call** `{block.name}` (`{block.id}`)", "", _fence(_arguments_json(block), "json"), ""]
            elif isinstance(block, ImageContent):
                out += [f"*{_image(block)}*", ""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.45; }
table.meta td { padding: 0.1rem 0.8rem 0.1rem 0; vertical-align: top; }
.msg { border-left: 4px solid #ccc; margin: 1.2rem 0; padding: 0.2rem 0 0.2rem 0.9rem; }
.msg.user { border-color: #3572b0; } .msg.assistant { border-color: #2e8540; }
.msg.tool { border-color: #999; } .msg.system { border-color: #8a6d3b; }
.role { font-weight: 600; color: #444; }
.text { white-space: pre-wrap; }
.thinking { color: #666; white-space: pre-wrap; }
.error { color: #b00020; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; }
"""


def to_html(session: AgentSession, messages: Sequence[Message]) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Session {e(session.session_id)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Session {e(session.session_id)}</h1>",
        '<table class="meta">',
    ]
    out += [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in _header_rows(session, messages)]
    out.append("</table>")
    for i, m in enumerate(messages):
        out.append(f'<div class="msg {e(m.role)}"><div class="role">{e(_role_line(i, m))}</div>')
        if m.role == "tool":
            cls = ' class="error"' if _is_error(m) else ""
            out.append(f"<pre{cls}>{e(m.text)}</pre>")
        for block in () if m.role == "tool" else m.blocks:
            if isinstance(block, TextContent):
                out.append(f'<div class="text">{e(block.text)}</div>')
            elif isinstance(block, ThinkingContent):
                text = "(redacted)" if block.redacted else block.thinking
                out.append(f'<details><summary>thinking</summary><div class="thinking">{e(text)}</div></details>')
            elif isinstance(block, ToolCallContent):
                out.append(f"<div>tool call <code>{e(block.name)}</code> <small>{e(block.id)}</small></div>")
                out.append(f"<pre>{e(_arguments_json(block))}</pre>")
            elif isinstance(block, ImageContent):
                if block.url is not None and not block.url.lower().startswith(("http://", "https://")):
                    out.append(f"<div>{e(_image(block))}</div>")  # never a javascript: or file: source
                elif block.url is not None:
                    out.append(f'<img src="{e(block.url)}" alt="image" style="max-width:100%">')
                else:
                    src = f"data:{e(block.media_type)};base64,{e(block.data or '')}"
                    out.append(f'<img src="{src}" alt="image" style="max-width:100%">')
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------


def to_jsonl(messages: Sequence[Message]) -> str:
    """One `Message.to_dict()` per line: `Message.from_dict(json.loads(line))` reads it back."""
    lines: list[Any] = [json.dumps(m.to_dict(), ensure_ascii=False, separators=(",", ":")) for m in messages]
    return "".join(line + "\n" for line in lines)
