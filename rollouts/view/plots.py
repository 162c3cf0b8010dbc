"""Small charts drawn by the viewer itself as inline SVG (no script, no external file, so the
Content-Security-Policy stays as strict): an eval set's means with their intervals, and a
training run's curves. Every text is escaped; sizes are SVG attributes (no inline style)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

from rollouts.view.catalog import EvalSetCell

__all__ = ["DOTS_MAX", "POINTS_MAX", "ci_plot", "line_plot"]

POINTS_MAX = 1000  # a curve's points past this are thinned (so a page stays small however long the run)
DOTS_MAX = 300  # a curve with more points than this draws its line only (no dot per step)


def _axis(values: Sequence[float]) -> tuple[float, float]:
    """The x range: [0, 1] when every value lies in it (rewards, mostly), else the values' range
    with a margin."""
    lo, hi = min(values), max(values)
    if lo >= 0.0 and hi <= 1.0:
        return 0.0, 1.0
    if hi - lo < 1e-12:
        return lo - 1.0, hi + 1.0
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def ci_plot(cells: Sequence[EvalSetCell], *, width: int = 560, confidence: float = 0.95) -> Markup:
    """Each model's mean (a dot) and its interval (a bar) on one axis, one row per model."""
    shown = [c for c in cells if c.mean is not None]
    if not shown:
        return Markup('<p class="muted">no scores yet</p>')
    label_w, pad_r, row_h, top, bottom = 200, 16, 22, 6, 26
    values = [v for c in shown for v in (c.mean, *(c.ci or ())) if v is not None]
    x0, x1 = _axis(values)
    iw = width - label_w - pad_r
    height = top + row_h * len(shown) + bottom

    def sx(x: float) -> float:
        return label_w + (x - x0) / (x1 - x0) * iw

    rows = []
    for i, c in enumerate(shown):
        y = top + row_h * i + row_h / 2
        assert c.mean is not None
        lo, hi = c.ci if c.ci is not None else (c.mean, c.mean)
        template = Markup(
            '<g class="ci"><title>{model}: {mean:.4f} [{lo:.4f}, {hi:.4f}], n={n}</title>'
            '<text x="{lx}" y="{ty:.1f}" text-anchor="end">{label}</text>'
            '<line x1="{a:.1f}" x2="{b:.1f}" y1="{y:.1f}" y2="{y:.1f}" class="bar"/>'
            '<line x1="{a:.1f}" x2="{a:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" class="bar"/>'
            '<line x1="{b:.1f}" x2="{b:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" class="bar"/>'
            '<circle cx="{m:.1f}" cy="{y:.1f}" r="4"/></g>'
        )
        label = c.model if len(c.model) <= 28 else c.model[:27] + "…"
        fields: dict[str, Any] = {"model": c.model, "mean": c.mean, "lo": lo, "hi": hi, "n": c.n, "lx": label_w - 8, "ty": y + 4,
                  "label": label, "a": sx(lo), "b": sx(hi), "y": y, "y0": y - 5, "y1": y + 5, "m": sx(c.mean)}  # fmt: skip
        rows.append(template.format(**fields))
    axis_y = top + row_h * len(shown)
    ticks = "".join(
        f'<line x1="{sx(v):.1f}" x2="{sx(v):.1f}" y1="{top}" y2="{axis_y}" class="grid"/>'
        f'<text x="{sx(v):.1f}" y="{axis_y + 16}" text-anchor="middle">{v:.2f}</text>'
        for v in (x0, (x0 + x1) / 2, x1)
    )
    label = escape(f"mean reward with its {round(confidence * 100)}% interval")
    return Markup(
        f'<svg class="plot ci-plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{label}">{ticks}{Markup("").join(rows)}</svg>'
    )


def line_plot(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    x_label: str = "step",
    width: int = 420,
    height: int = 180,
    href: str | None = None,
    hrefs: Mapping[float, str | None] | None = None,
) -> Markup:
    """One curve (`points` as (x, y), non-finite y left out) with its title, as inline SVG;
    `href` links the title, `hrefs[x]` the point at x."""
    pts = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    head = escape(title)
    if not pts:
        empty = Markup(
            '<svg class="plot curve-plot empty" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
            'aria-label="{t}: no values"><text x="{cx}" y="{cy}" text-anchor="middle">no values</text></svg>'
        ).format(w=width, h=height, t=head, cx=width // 2, cy=height // 2)
        return Markup('<figure class="curve"><figcaption>{}</figcaption>{}</figure>').format(head, empty)
    if len(pts) > POINTS_MAX:  # (a long run: every k-th step, and the last; the table has them all)
        k = math.ceil(len(pts) / POINTS_MAX)
        pts = pts[::k] if (len(pts) - 1) % k == 0 else [*pts[::k], pts[-1]]
    pad_l, pad_r, pad_t, pad_b = 64, 10, 8, 26
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 1.0 if y0 == 0 else y0 - abs(y0) * 0.1, y1 + 1.0 if y1 == 0 else y1 + abs(y1) * 0.1
    iw, ih = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * iw

    def sy(y: float) -> float:
        return pad_t + ih - (y - y0) / (y1 - y0) * ih

    path = "M" + "L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    links = hrefs or {}

    def dot(x: float, y: float) -> str:
        circle = f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"><title>{x:g}: {y:.4g}</title></circle>'
        link = links.get(x)
        return str(Markup('<a href="{}">{}</a>').format(link, Markup(circle))) if link else circle

    dots = "".join(dot(x, y) for x, y in pts) if len(pts) <= DOTS_MAX else ""
    yticks = "".join(
        f'<text x="{pad_l - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
        f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
        for v in (y0, (y0 + y1) / 2, y1)
    )
    xticks = "".join(
        f'<text x="{sx(v):.1f}" y="{height - 8}" text-anchor="middle">{v:g}</text>' for v in sorted({x0, x1})
    )
    svg = Markup(
        f'<svg class="plot curve-plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{head} against {escape(x_label)}">{yticks}{xticks}<path d="{path}" class="line"/>'
        f'<g class="dots">{dots}</g></svg>'
    )
    caption = Markup('<a href="{}">{}</a>').format(href, head) if href else head
    return Markup('<figure class="curve"><figcaption>{}</figcaption>{}</figure>').format(caption, svg)
