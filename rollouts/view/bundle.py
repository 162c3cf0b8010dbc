"""A static, self-contained copy of the viewer's pages that opens from disk (relative links,
no server, no script): `rollouts view --bundle DIR [PATHS...]`.

    DIR/index.html  sessions.html  sessions/<id>.html  sessions/<id>.diff.html
        evals.html  evals/<run>.html  evals/<run>/<sample hash>.html  sets/<set>.html  training.html  training/<run>.html
        gepa.html   gepa/<run>.html  gepa/<run>/c<idx>.html  static/style.css  static/favicon.svg

Lists hold their first page (filters and later pages need the server); each session listed,
each sample on a run's first page and every GEPA candidate get their own page.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from rollouts.view import pages
from rollouts.view.catalog import Catalog, SampleQuery, SessionQuery
from rollouts.view.links import BundleLinks, sample_file_name
from rollouts.view.render import STATIC


async def write_bundle(catalog: Catalog, out: Path, *, max_sessions: int = 200) -> list[Path]:
    """Write the bundle into `out` (created; existing files of the same names are replaced)
    and return the files written. A catalog with `index_once` is fully indexed first."""
    index_once = getattr(catalog, "index_once", None)
    if index_once is not None:
        await index_once()
    await trio.to_thread.run_sync(lambda: out.mkdir(parents=True, exist_ok=True))
    written: list[Path] = []

    sessions = (await catalog.list_sessions(SessionQuery(limit=max_sessions))).items
    session_ids = {s.session_id for s in sessions}
    runs = list(await catalog.list_eval_runs())
    samples: set[tuple[str, str]] = set()
    first_pages = {}
    for r in runs:
        first = await catalog.list_samples(r.run_id, SampleQuery(limit=pages.PAGE_SIZE))
        first_pages[r.run_id] = first
        samples.update((r.run_id, s.sample_id) for s in first.items)

    def links(current: str) -> BundleLinks:
        return BundleLinks(current, sessions=session_ids, samples=samples, runs={r.run_id for r in runs})

    async def page(path: str, make: Callable[..., Awaitable[str]], *ids: Any) -> None:
        html = await make(catalog, links(path), *ids, {})
        target = out / path
        await trio.to_thread.run_sync(_write, target, html)
        written.append(target)

    await page("index.html", pages.index_page)
    await page("sessions.html", pages.sessions_page)
    for s in sessions:
        await page(f"sessions/{s.session_id}.html", pages.session_page, s.session_id)
        if s.parent_id is not None:
            await page(f"sessions/{s.session_id}.diff.html", pages.session_diff_page, s.session_id)
    await page("evals.html", pages.evals_page)
    for r in runs:
        await page(f"evals/{r.run_id}.html", pages.eval_run_page, r.run_id)
        for row in first_pages[r.run_id].items:
            name = sample_file_name(row.sample_id)
            await page(f"evals/{r.run_id}/{name}.html", pages.sample_page, r.run_id, row.sample_id)
    for st in await catalog.list_eval_sets():
        await page(f"sets/{st.set_id}.html", pages.eval_set_page, st.set_id)
    await page("training.html", pages.training_runs_page)
    for t in await catalog.list_training_runs():
        await page(f"training/{t.run_id}.html", pages.training_run_page, t.run_id)
    await page("gepa.html", pages.gepa_runs_page)
    for g in await catalog.list_gepa_runs():
        await page(f"gepa/{g.run_id}.html", pages.gepa_run_page, g.run_id)
        for idx in range(g.n_candidates):
            await page(f"gepa/{g.run_id}/c{idx}.html", pages.candidate_page, g.run_id, idx)
    for name in ("style.css", "favicon.svg"):
        await trio.to_thread.run_sync(_write, out / "static" / name, (STATIC / name).read_text(encoding="utf-8"))
        written.append(out / "static" / name)
    return written


def _write(target: Path, html: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html, encoding="utf-8")
