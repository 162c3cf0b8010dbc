"""HTML building blocks: the Jinja2 environment (autoescaping everything), number formats,
diffs, and the plots and trees drawn as SVG/HTML on the server (no script needed to see them).

Everything a model or a user wrote reaches the page through Jinja2's autoescape or
`markupsafe.escape`; the only `Markup` built here is from escaped parts and numbers.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from rollouts.dtypes import Message, TextContent, ThinkingContent, ToolCallContent
from rollouts.gepa.result import CandidateRecord, IterationRecord
from rollouts.view.text import ansi_html, markdown_html

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def num(value: Any, digits: int = 3) -> str:
    """A number for a table cell ('' for None)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def money(value: Any) -> str:
    if not value:
        return ""
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, money=money, pretty_json=pretty_json, clip=clip, bidi=neutral_bidi)
    env.globals.update(
        message_parts=message_parts,
        message_is_error=message_is_error,
        markdown_html=markdown_html,
        ansi_html=ansi_html,
        timeline=timeline,
    )
    return env


# --------------------------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------------------------


TEXT_SHOWN = 20_000  # characters of one message part a page shows; the rest is a "show all" link away
LONG_LINES = 40  # a part with more lines than this starts collapsed
# bidirectional overrides and isolates: shown as visible marks, so model text cannot reorder
# what the page displays around it (or spoof a file name, an id, a verdict)
_BIDI = {c: f"\u27e8U+{c:04X}\u27e9" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def neutral_bidi(text: str) -> str:
    """`text` with its bidirectional control characters replaced by visible marks."""
    return text.translate(_BIDI)


@dataclass(frozen=True)
class Part:
    """One displayable piece of a message: kind is text, thinking, tool_call, image. `text` is
    cut at TEXT_SHOWN characters (`hidden` more not shown); `long` parts start collapsed."""

    kind: str
    text: str = ""
    name: str = ""
    call_id: str = ""
    error: str = ""
    hidden: int = 0
    lines: int = 0

    @property
    def long(self) -> bool:
        return self.lines > LONG_LINES or self.hidden > 0


def _part(kind: str, text: str, name: str = "", call_id: str = "", error: str = "", *, limit: int) -> Part:
    shown = neutral_bidi(text[:limit])
    return Part(kind, shown, name, call_id, error, hidden=max(0, len(text) - limit), lines=shown.count("\n") + 1)


def message_parts(message: Message, limit: int = TEXT_SHOWN) -> list[Part]:
    """The displayable parts of `message`, each cut at `limit` characters."""
    parts: list[Part] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            parts.append(_part("text", b.text, limit=limit))
        elif isinstance(b, ThinkingContent):
            parts.append(_part("thinking", b.thinking if not b.redacted else "(redacted thinking)", limit=limit))
        elif isinstance(b, ToolCallContent):
            args = b.raw_arguments if b.parse_error and b.raw_arguments else pretty_json(dict(b.arguments))
            parts.append(_part("tool_call", args, b.name, b.id, b.parse_error or "", limit=limit))
        else:
            parts.append(Part("image", getattr(b, "url", None) or f"({getattr(b, 'media_type', 'image')}, inline)"))
    return parts


def full_part_text(message: Message, index: int) -> str:
    """The whole text of part `index` of `message` (what "show all" loads)."""
    parts = message_parts(message, limit=1 << 62)
    if not 0 <= index < len(parts):
        raise IndexError(index)
    return parts[index].text


def clip(text: str, limit: int = TEXT_SHOWN) -> str:
    """`text` cut at `limit` characters, saying how many more there are."""
    if len(text) <= limit:
        return neutral_bidi(text)
    return neutral_bidi(text[:limit]) + f"\n… {len(text) - limit:,} more characters"


@dataclass(frozen=True)
class TimelineEvent:
    """One step of a sample, in order: a model call (its latency, time to first token, tokens,
    cost, attempts) or a tool call (its duration, from the timestamps around it), and errors."""

    index: int  # the message it produced
    kind: str  # "model" | "tool" | "user"
    what: str
    latency_s: float | None = None
    ttft_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    attempts: int | None = None
    finish: str = ""
    error: bool = False
    raw_request: str = ""  # the call's raw request and response, when the run recorded them
    raw_response: str = ""


def _seconds_between(start: str | None, end: str | None) -> float | None:
    from datetime import datetime

    if not start or not end:
        return None
    try:
        return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())
    except ValueError:
        return None


def timeline(trajectory: Any) -> list[TimelineEvent]:
    """The events of a trajectory (see TimelineEvent); empty without one."""
    if trajectory is None:
        return []
    completions = {c.message_index: c for c in getattr(trajectory, "completions", ())}
    events: list[TimelineEvent] = []
    calls: dict[str, tuple[str, str | None]] = {}  # tool call id -> (name, timestamp of the call)
    for i, m in enumerate(trajectory.messages):
        if m.role == "assistant":
            c = completions.get(i)
            for b in m.blocks:
                if isinstance(b, ToolCallContent):
                    calls[b.id] = (b.name, m.timestamp)
            u = m.usage
            events.append(TimelineEvent(
                i, "model", f"{m.provider or (c.provider if c else '')}/{m.model or (c.model if c else '')}".strip("/"),
                latency_s=c.duration_s if c else None, ttft_s=c.time_to_first_token_s if c else None,
                input_tokens=u.input_tokens if u else None, output_tokens=u.output_tokens if u else None,
                cost_usd=u.cost_usd if u else None, attempts=c.attempts if c else None,
                finish=(c.finish_reason or "") if c else "", error=message_is_error(m),
                raw_request=_pretty_raw(c.raw_request) if c else "", raw_response=(c.raw_response or "") if c else "",
            ))  # fmt: skip
        elif m.role == "tool":
            name, started = calls.get(m.tool_call_id or "", (str((m.details or {}).get("tool_name") or "tool"), None))
            events.append(TimelineEvent(i, "tool", neutral_bidi(name), latency_s=_seconds_between(started, m.timestamp),
                                        error=message_is_error(m)))  # fmt: skip
        elif m.role == "user" and i > 0:
            events.append(TimelineEvent(i, "user", "user message"))
    return events


def _pretty_raw(text: str | None) -> str:
    """A recorded request, indented when it is whole JSON (a cut one is shown as stored)."""
    if not text:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def message_is_error(message: Message) -> bool:
    return bool((message.details or {}).get("is_error"))


def message_signature(message: Message) -> str:
    """What makes two messages "the same" in a branch diff."""
    return message.role + "\0" + json.dumps(message.to_dict().get("content"), sort_keys=True, default=str)


@dataclass(frozen=True)
class DiffItem:
    op: str  # "same", "parent", "branch"
    index: int  # position in the history
    message: Message


def branch_diff(parent: Sequence[Message], branch: Sequence[Message], start: int) -> list[DiffItem]:
    """The messages after the branch point `start`, aligned: kept by both, only the parent's,
    only the branch's (`parent` and `branch` are the messages from `start` on)."""
    a = [message_signature(m) for m in parent]
    b = [message_signature(m) for m in branch]
    out: list[DiffItem] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            out.extend(DiffItem("same", start + j, branch[j]) for j in range(j1, j2))
            continue
        out.extend(DiffItem("parent", start + i, parent[i]) for i in range(i1, i2))
        out.extend(DiffItem("branch", start + j, branch[j]) for j in range(j1, j2))
    return out


def text_diff(old: str, new: str, *, old_name: str = "parent", new_name: str = "candidate") -> Markup:
    """A unified diff as HTML lines (each escaped; added/removed lines marked by class)."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="")
    out = []
    for line in lines:
        cls = (
            "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "hunk"
            if line.startswith("@@")
            else ""
        )
        out.append(Markup('<span class="{}">{}</span>').format(cls, line))
    if not out:
        return Markup('<span class="muted">(unchanged)</span>')
    return Markup("\n").join(out)


# --------------------------------------------------------------------------------------------
# GEPA: the score plot and the lineage tree
# --------------------------------------------------------------------------------------------


def best_score_points(
    candidates: Sequence[CandidateRecord], history: Sequence[IterationRecord], valset_size: int
) -> list[tuple[float, float]]:
    """(metric calls, best validation score so far): the seed, then each accepted candidate."""
    if not candidates:
        return []
    best = candidates[0].val_score
    points = [(float(valset_size), best)]
    by_idx = {c.idx: c for c in candidates}
    for h in history:
        if h.new_candidate is not None and h.new_candidate in by_idx:
            best = max(best, by_idx[h.new_candidate].val_score)
        points.append((float(h.metric_calls), best))
    return points


def score_plot(points: Sequence[tuple[float, float]], *, width: int = 560, height: int = 220) -> Markup:
    """A step plot of best score against metric calls, as inline SVG."""
    pad_l, pad_r, pad_t, pad_b = 44, 12, 10, 28
    if not points:
        return Markup('<p class="muted">no scores yet</p>')
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(0.0, min(ys)), max(1.0, max(ys))
    iw, ih = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * iw

    def sy(y: float) -> float:
        return pad_t + ih - (y - y0) / (y1 - y0) * ih

    path = [f"M{sx(xs[0]):.1f},{sy(ys[0]):.1f}"]
    for (x, y), (_, prev_y) in zip(points[1:], points[:-1], strict=True):
        path.append(f"L{sx(x):.1f},{sy(prev_y):.1f}L{sx(x):.1f},{sy(y):.1f}")
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>' for x, y in points)
    ticks = "".join(
        f'<text x="{pad_l - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>'
        f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
        for v in (y0, (y0 + y1) / 2, y1)
    )
    xticks = "".join(
        f'<text x="{sx(v):.1f}" y="{height - 8}" text-anchor="middle">{int(v)}</text>' for v in (x0, (x0 + x1) / 2, x1)
    )
    svg = (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="best score against metric calls">{ticks}{xticks}'
        f'<path d="{"".join(path)}" class="line"/><g class="dots">{dots}</g>'
        f'<text x="{width - pad_r}" y="{height - 8 - 12}" text-anchor="end" class="muted">metric calls</text></svg>'
    )
    return Markup(svg)


def lineage_tree(candidates: Sequence[CandidateRecord], on_front: Iterable[int], best_idx: int, href: Any) -> Markup:
    """Candidates as a nested list by first parent; merges name their second parent; the
    Pareto front (★) and the best (class best) are marked. `href(idx)` links each one."""
    front = set(on_front)
    children: dict[int, list[CandidateRecord]] = {}
    roots: list[CandidateRecord] = []
    for c in candidates:
        if c.parents and c.parents[0] < c.idx:
            children.setdefault(c.parents[0], []).append(c)
        else:
            roots.append(c)

    def item(c: CandidateRecord, depth: int) -> Markup:
        classes = " ".join(n for n, on in (("front", c.idx in front), ("best", c.idx == best_idx)) if on)
        mark = Markup(' <span class="star" title="on the Pareto front">★</span>') if c.idx in front else Markup("")
        merge = (
            Markup(' <span class="muted">merge of {}</span>').format(" + ".join(map(str, c.parents)))
            if c.origin == "merge"
            else Markup("")
        )
        link = href(c.idx)
        label = Markup("#{} <b>{}</b>").format(c.idx, f"{c.val_score:.3f}")
        head = Markup('<a href="{}">{}</a>').format(link, label) if link else label
        kids = children.get(c.idx, []) if depth < 200 else []
        sub = Markup("<ul>{}</ul>").format(Markup("").join(item(k, depth + 1) for k in kids)) if kids else Markup("")
        return Markup('<li class="{}" data-candidate="{}">{}{}{}{}</li>').format(classes, c.idx, head, mark, merge, sub)

    return Markup('<ul class="tree">{}</ul>').format(Markup("").join(item(r, 0) for r in roots))
