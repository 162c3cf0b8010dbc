"""The pages: each reads what it shows from a Catalog and renders one template.

Page functions take the catalog, a `Links` (server URLs or bundle files) and the request's
query parameters, and return HTML. They raise NotFound (404) for unknown ids and ValueError
(400) for bad query values; the app turns both into error pages.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jinja2
from markupsafe import Markup

from rollouts.dtypes import Message
from rollouts.view.catalog import (
    METRIC_OPS,
    SAMPLE_SORTS,
    Catalog,
    EvalRunRow,
    NotFound,
    SampleQuery,
    SessionQuery,
    TrainingRunDetail,
)
from rollouts.view.links import Links
from rollouts.view.plots import ci_plot, line_plot
from rollouts.view.render import (
    best_score_points,
    branch_diff,
    environment,
    full_part_text,
    lineage_tree,
    score_plot,
    text_diff,
)

Params = Mapping[str, str]
PAGE_SIZE = 50
TRANSCRIPT_PAGE = 200


@functools.cache
def _env() -> jinja2.Environment:
    return environment()


def compile_templates() -> None:
    """Compile every template now (the app does it at creation), so that no first request
    pays for it."""
    env = _env()
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)


def render(template: str, links: Links, **context: Any) -> str:
    return _env().get_template(template).render(links=links, **context)


def render_page(links: Links, title: str, body: str) -> str:
    """`body` (HTML the caller built and escaped) in the viewer's layout: for pages a host app
    adds through `create_app(routes=...)`."""
    return render("page.html", links, title=title, body=Markup(body))


INT_PARAM_MAX = 10**9  # a page number, offset or limit above this is a mistake (and would overflow SQL)


def _int(params: Params, name: str, default: int = 0, maximum: int = INT_PARAM_MAX) -> int:
    raw = params.get(name, "")
    if raw == "":
        return default
    if len(raw) > 30:  # (int() of a huge text is slow; no valid value is that long)
        raise ValueError(f"{name} must be a whole number up to {maximum}, got {raw[:30]!r}...")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if abs(value) > maximum:
        raise ValueError(f"{name} must be a whole number up to {maximum}, got {raw}")
    return value


def offset_param(params: Params, default: int = 0) -> int:
    """The `offset` query parameter (0 when absent; 400 when not a number or too big)."""
    return _int(params, "offset", default)


def _float(params: Params, name: str) -> float | None:
    raw = params.get(name, "")
    if raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def _pair(params: Params, name: str) -> tuple[str, str] | None:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    if "=" not in raw:
        raise ValueError(f"{name} must look like key=value, got {raw!r}")
    k, v = raw.split("=", 1)
    return k.strip(), v.strip()


def _page_number(params: Params) -> int:
    return max(1, _int(params, "page", 1, maximum=INT_PARAM_MAX // 1000))


# --------------------------------------------------------------------------------------------


async def index_page(catalog: Catalog, links: Links, params: Params) -> str:
    sessions = await catalog.list_sessions(SessionQuery(limit=10))
    evals = await catalog.list_eval_runs()
    gepa = await catalog.list_gepa_runs()
    sets = await catalog.list_eval_sets()
    training = await catalog.list_training_runs() if links.show_training else ()
    return render("index.html", links, title="rollouts view", sessions=sessions, evals=evals, gepa=gepa, sets=sets,
                  training=training)  # fmt: skip


async def sessions_page(catalog: Catalog, links: Links, params: Params) -> str:
    page_no = _page_number(params)
    q = SessionQuery(
        text=params.get("q", "").strip(),
        status=params.get("status", ""),
        model=params.get("model", "").strip(),
        tag=_pair(params, "tag"),
        offset=(page_no - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
    )
    page = await catalog.list_sessions(q)
    form = {k: params.get(k, "") for k in ("q", "status", "model", "tag")}
    return render("sessions.html", links, title="Sessions", page=page, page_no=page_no, form=form)


async def session_page(catalog: Catalog, links: Links, session_id: str, params: Params) -> str:
    page_no = _page_number(params)
    detail = await catalog.get_session(session_id, offset=(page_no - 1) * TRANSCRIPT_PAGE, limit=TRANSCRIPT_PAGE)
    return render(
        "session.html", links, title=f"Session {session_id}", d=detail, page_no=page_no, per_page=TRANSCRIPT_PAGE,
        text_link=lambda m, p: links.session_text(session_id, m, p),
    )  # fmt: skip


async def session_diff_page(catalog: Catalog, links: Links, session_id: str, params: Params) -> str:
    detail = await catalog.get_session(session_id, limit=1)
    row = detail.row
    if row.parent_id is None or row.branch_point is None:
        raise NotFound(f"session {session_id} is not a branch: it has no parent to compare with")
    start = row.branch_point
    branch = (await catalog.get_session(session_id, offset=start, limit=TRANSCRIPT_PAGE)).messages
    parent = (await catalog.get_session(row.parent_id, offset=start, limit=TRANSCRIPT_PAGE)).messages
    items = branch_diff(parent, branch, start)
    return render("diff.html", links, title=f"Branch {session_id} vs its parent", row=row, items=items, d=detail)


RUN_SORTS = {"date": lambda r: r.started_at, "name": lambda r: r.name.lower(), "task": lambda r: r.task.lower(),
             "model": lambda r: r.model.lower(), "score": lambda r: (r.mean_reward is not None, r.mean_reward or 0.0),
             "samples": lambda r: r.n_samples}  # fmt: skip


async def evals_page(catalog: Catalog, links: Links, params: Params) -> str:
    """The runs, filtered (`q`: text in name, task, model or location) and sorted (`sort` one of
    RUN_SORTS, `order` asc|desc; newest first by default)."""
    runs = list(await catalog.list_eval_runs())
    text = params.get("q", "").strip().lower()
    if text:
        runs = [r for r in runs if any(text in x.lower() for x in (r.name, r.task, r.model, r.location, r.run_id))]
    sort = params.get("sort", "") or "date"
    if sort not in RUN_SORTS:
        raise ValueError(f"sort must be one of {', '.join(RUN_SORTS)}, got {sort!r}")
    descending = params.get("order", "desc" if sort in ("date", "score", "samples") else "asc") == "desc"
    runs.sort(key=RUN_SORTS[sort], reverse=descending)
    form = {"q": params.get("q", ""), "sort": sort, "order": "desc" if descending else "asc"}
    sets = await catalog.list_eval_sets()
    return render("evals.html", links, title="Evaluations", runs=runs, form=form, sets=sets)


def sample_query(params: Params) -> SampleQuery:
    failed_raw = params.get("failed", "")
    if failed_raw not in ("", "yes", "no"):
        raise ValueError(f"failed must be yes or no, got {failed_raw!r}")
    op = params.get("op", ">=") or ">="
    if op not in METRIC_OPS:
        raise ValueError(f"op must be one of {' '.join(METRIC_OPS)}, got {op!r}")
    sort = params.get("sort", "seq") or "seq"
    if sort not in SAMPLE_SORTS and not sort.startswith("metric:"):
        raise ValueError(f"sort must be one of {', '.join(SAMPLE_SORTS)} or metric:NAME, got {sort!r}")
    page_no = _page_number(params)
    return SampleQuery(
        text=params.get("q", "").strip(),
        status=params.get("status", ""),
        failed=None if failed_raw == "" else failed_raw == "yes",
        metric=params.get("metric", ""),
        op=op,
        value=_float(params, "value"),
        meta=_pair(params, "meta"),
        sort=sort,
        descending=params.get("order", "") == "desc",
        offset=(page_no - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
    )


async def eval_run_page(catalog: Catalog, links: Links, run_id: str, params: Params) -> str:
    detail = await catalog.get_eval_run(run_id)
    q = sample_query(params)
    page = await catalog.list_samples(run_id, q)
    others, unrelated = await _comparable(catalog, run_id)
    form = {k: params.get(k, "") for k in _SAMPLE_PARAMS}
    return render(
        "eval_run.html",
        links,
        title=f"Eval {detail.row.name}",
        d=detail,
        page=page,
        page_no=_page_number(params),
        q=q,
        form=form,
        others=others,
        unrelated=unrelated,
        sorts=SAMPLE_SORTS,
        ops=METRIC_OPS,
        live_query={k: v for k, v in params.items() if k in (*_SAMPLE_PARAMS, "page") and v},
        table_query=_table_query(params),
    )


async def _comparable(catalog: Catalog, run_id: str, exclude: Sequence[str] = ()) -> tuple[list[EvalRunRow], int]:
    """The runs worth comparing with `run_id` (they share sample ids with it; none of
    `exclude`), and how many other runs do not."""
    sharing = set(await catalog.runs_sharing_samples(run_id))
    rest = [r for r in await catalog.list_eval_runs() if r.run_id != run_id and r.run_id not in exclude]
    offered = [r for r in rest if r.run_id in sharing]
    return offered, len(rest) - len(offered)


def _table_query(params: Params) -> dict[str, str]:
    """The filters and order of a samples table (what a sample's previous/next follow)."""
    return {k: v for k, v in params.items() if k in _SAMPLE_PARAMS and v}


_SAMPLE_PARAMS = ("q", "status", "failed", "metric", "op", "value", "meta", "sort", "order")


async def sample_rows(catalog: Catalog, links: Links, run_id: str, params: Params) -> str:
    """The rows of a run's samples table for `params` (the live page refreshes them)."""
    detail = await catalog.get_eval_run(run_id)
    page = await catalog.list_samples(run_id, sample_query(params))
    macros: Any = _env().get_template("_macros.html").module
    return str(macros.sample_rows(detail, page, links, _table_query(params)))


async def sample_page(catalog: Catalog, links: Links, run_id: str, sample_id: str, params: Params) -> str:
    detail = await catalog.get_eval_run(run_id)
    sample = await catalog.get_sample(run_id, sample_id)
    prev, next_ = await _neighbours(catalog, run_id, sample_id, params)
    query = _table_query(params)
    pos = _int(params, "pos") if params.get("pos") else 0
    target = next((sample.input[k] for k in TARGET_KEYS if sample.input.get(k) not in (None, "")), None)
    return render(
        "sample.html", links, title=f"Sample {sample_id}", d=detail, s=sample, target=target,
        text_link=lambda m, p: links.sample_text(run_id, sample_id, m, p),
        prev=links.sample(run_id, prev, pos=str(pos - 1), **query) if prev is not None else None,
        next=links.sample(run_id, next_, pos=str(pos + 1), **query) if next_ is not None else None,
        explanation=explanation,
    )  # fmt: skip


TARGET_KEYS = ("target", "expected", "expected_answer", "answer", "ground_truth", "reference", "label")


def explanation(metric: Any) -> str:
    """What a scorer said about a metric's value (its metadata's explanation, feedback or reason)."""
    meta = getattr(metric, "metadata", None) or {}
    for key in ("explanation", "feedback", "reason", "rationale"):
        if meta.get(key):
            return str(meta[key])
    return ""


async def _neighbours(catalog: Catalog, run_id: str, sample_id: str, params: Params) -> tuple[str | None, str | None]:
    """The samples before and after this one in the table it was opened from (its filters and
    order, `pos` its position there); (None, None) when it is not where `pos` says (the run
    changed since, or no position was given)."""
    if not params.get("pos"):
        return None, None
    pos = _int(params, "pos")
    if pos < 0:
        return None, None
    q = replace(sample_query(params), offset=max(0, pos - 1), limit=3)
    ids = [s.sample_id for s in (await catalog.list_samples(run_id, q)).items]
    i = pos - q.offset
    if not (0 <= i < len(ids) and ids[i] == sample_id):
        return None, None
    return (ids[i - 1] if i > 0 else None), (ids[i + 1] if i + 1 < len(ids) else None)


def _message_at(messages: Sequence[Message], index: int, what: str) -> Message:
    if not 0 <= index < len(messages):
        raise NotFound(f"{what} has no message {index}")
    return messages[index]


async def sample_text(catalog: Catalog, params: Params) -> str:
    """The whole text of part `p` of message `m` of sample `id` of run `run` (a page shows the
    first TEXT_SHOWN characters of it)."""
    run_id, sample_id = params.get("run", ""), params.get("id", "")
    sample = await catalog.get_sample(run_id, sample_id)
    messages = sample.trajectory.messages if sample.trajectory else ()
    message = _message_at(messages, _int(params, "m"), f"sample {sample_id!r}")
    return _part_text(message, _int(params, "p"))


async def session_text(catalog: Catalog, params: Params) -> str:
    """The whole text of part `p` of message `m` of session `id`."""
    session_id, index = params.get("id", ""), _int(params, "m")
    detail = await catalog.get_session(session_id, offset=max(0, index), limit=1)
    return _part_text(
        _message_at(detail.messages, 0 if index >= 0 else -1, f"session {session_id!r}"), _int(params, "p")
    )


def _part_text(message: Message, part: int) -> str:
    try:
        return full_part_text(message, part)
    except IndexError:
        raise NotFound(f"that message has no part {part}") from None


COMPARE_MAX = 8


@dataclass(frozen=True)
class CompareRun:
    """One run of a comparison: its row (with metric means) and its overlap with the baseline."""

    row: EvalRunRow
    shared: int
    regressed: int
    improved: int


async def compare_page(catalog: Catalog, links: Links, params: Params) -> str:
    """Runs side by side (`runs=A,B,C`, the first the baseline; or `a=` and `b=`): every run on
    every metric, and the per-sample table of the baseline against `vs` (the second by default)."""
    ids = [x for x in params.get("runs", "").split(",") if x] or [x for x in (params.get("a"), params.get("b")) if x]
    ids = list(dict.fromkeys(ids))
    if len(ids) < 2:
        raise ValueError("compare needs two runs or more: check them on the Evaluations page (or ?a=RUN&b=RUN)")
    if len(ids) > COMPARE_MAX:
        raise ValueError(f"compare takes at most {COMPARE_MAX} runs, got {len(ids)}")
    vs = params.get("vs") or ids[1]
    if vs not in ids[1:]:
        raise ValueError(f"vs must be one of the compared runs other than the first, got {vs!r}")
    page_no = _page_number(params)
    cmp = await catalog.compare_runs(ids[0], vs, offset=(page_no - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    runs = [CompareRun((await catalog.get_eval_run(ids[0])).row, cmp.a.n_samples, 0, 0)]
    for other in ids[1:]:
        c = cmp if other == vs else await catalog.compare_runs(ids[0], other, limit=1)
        runs.append(CompareRun((await catalog.get_eval_run(other)).row, c.shared, c.regressed, c.improved))
    metrics = sorted({name for r in runs for name in r.row.metrics})
    addable, unrelated = await _comparable(catalog, ids[0], ids) if len(ids) < COMPARE_MAX else ([], 0)
    return render("compare.html", links, title="Compare runs", c=cmp, page_no=page_no, runs=runs, ids=ids, vs=vs,
                  metrics=metrics, addable=addable, unrelated=unrelated)  # fmt: skip


async def eval_set_page(catalog: Catalog, links: Links, set_id: str, params: Params) -> str:
    """An eval set: per task, each model's mean reward with its interval, n, failures, metrics
    and epoch reducers, linked to the pair's run; the task's runs compared sample by sample."""
    d = await catalog.get_eval_set(set_id)
    tasks = []
    for task, cells in d.by_task():
        runs = [c.run_id for c in cells if c.run_id is not None]
        compare = links.compare_runs(runs, runs[1]) if 2 <= len(runs) <= COMPARE_MAX else None
        tasks.append({
            "name": task, "cells": cells, "plot": ci_plot(cells, confidence=d.row.confidence), "compare": compare,
            "metrics": sorted({m for c in cells for m in c.metrics}),
            "reducers": list(dict.fromkeys(r for c in cells for r in c.epochs)),
        })  # fmt: skip
    return render("eval_set.html", links, title=f"Eval set {d.row.name}", d=d, tasks=tasks)


async def training_runs_page(catalog: Catalog, links: Links, params: Params) -> str:
    runs = await catalog.list_training_runs()
    return render("training_runs.html", links, title="Training runs", runs=runs)


# (log key, title) of the curves a training run's page draws, in this order
TRAINING_CURVES = (("reward_mean", "reward"), ("heldout_reward", "held-out reward"), ("kl", "KL"),
                   ("loss", "loss"), ("seconds", "seconds per step"))  # fmt: skip
MORE_CURVES = (("entropy", "entropy"), ("grad_norm", "gradient norm"), ("lr", "learning rate"),
               ("reward_std", "reward std"), ("tokens_per_s", "tokens per second"))  # fmt: skip
TRAINING_STEPS_PAGE = 100


def training_curves(d: TrainingRunDetail, links: Links, which: Sequence[tuple[str, str]] = TRAINING_CURVES) -> Markup:
    """The curves of a training run (drawn as SVG; a step's dot links to its rollouts when the
    run kept them), `which` of them: (log key, title), all drawn (an absent key: "no values")."""
    hrefs = {float(s.step): links.eval_run(s.samples_run_id) for s in d.steps if s.samples_run_id is not None}
    return Markup("").join(line_plot(d.series(k), title=t, hrefs=hrefs) for k, t in which)


async def training_run_page(catalog: Catalog, links: Links, run_id: str, params: Params) -> str:
    """A training run: its curves and its steps, newest first, each linked to its rollouts;
    live while its log grows."""
    d = await catalog.get_training_run(run_id)
    curves = training_curves(d, links)
    more = training_curves(d, links, [(k, t) for k, t in MORE_CURVES if k in d.keys])
    page_no = _page_number(params)
    newest = list(reversed(d.steps))
    shown = newest[(page_no - 1) * TRAINING_STEPS_PAGE : page_no * TRAINING_STEPS_PAGE]
    columns = [k for k in ("reward_mean", "heldout_reward", "kl", "loss", "entropy", "grad_norm", "lr", "seconds",
                           "failed") if k in d.keys]  # fmt: skip
    return render("training_run.html", links, title=f"Training {d.row.name}", d=d, curves=curves, more=more,
                  steps=shown, columns=columns, page_no=page_no,
                  has_next=page_no * TRAINING_STEPS_PAGE < len(newest), has_heldout="heldout_reward" in d.keys)  # fmt: skip


async def gepa_runs_page(catalog: Catalog, links: Links, params: Params) -> str:
    runs = await catalog.list_gepa_runs()
    return render("gepa_runs.html", links, title="GEPA runs", runs=runs)


def gepa_plot(detail: Any) -> Any:
    return score_plot(best_score_points(detail.candidates, detail.history, detail.valset_size))


async def gepa_run_page(catalog: Catalog, links: Links, run_id: str, params: Params) -> str:
    d = await catalog.get_gepa_run(run_id)
    tree = lineage_tree(d.candidates, d.on_front, d.row.best_idx, lambda i: links.candidate(run_id, i))
    return render("gepa_run.html", links, title=f"GEPA {d.row.name}", d=d, plot=gepa_plot(d), tree=tree)


async def candidate_page(catalog: Catalog, links: Links, run_id: str, idx: int, params: Params) -> str:
    d = await catalog.get_gepa_run(run_id)
    if not 0 <= idx < len(d.candidates):
        raise NotFound(f"GEPA run {run_id} has no candidate {idx} (it has {len(d.candidates)})")
    c = d.candidates[idx]
    parent = d.candidates[c.parents[0]] if c.parents and c.parents[0] < len(d.candidates) else None
    diffs = {
        name: text_diff(
            parent.components.get(name, "") if parent else "",
            text,
            old_name=f"#{parent.idx}" if parent else "(none)",
            new_name=f"#{c.idx}",
        )
        for name, text in c.components.items()
    }
    record = next((h for h in d.history if h.new_candidate == idx), None)
    reflections = await catalog.gepa_reflections(run_id, c.iteration) if c.iteration > 0 else ()
    instances = sorted(set(c.val_scores) | set(parent.val_scores if parent else ()))
    return render(
        "candidate.html",
        links,
        title=f"Candidate {idx}",
        d=d,
        c=c,
        parent=parent,
        diffs=diffs,
        record=record,
        reflections=reflections,
        instances=instances,
    )
