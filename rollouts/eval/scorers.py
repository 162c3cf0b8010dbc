"""Composable score functions: matchers, answer extraction, a combinator and an LLM judge.

A *metric function* takes a `Sample` and returns a number (bools count as 0/1), a
`(value, feedback)` pair, or a `Metric`; it may be sync or async. `combine()` turns named,
weighted metric functions into a score function for `EvalConfig.score_fn`:

    score_fn = combine(
        metric("correct", exact_match(extract=extract_tag("answer")), weight=1.0),
        metric("numeric", numeric_match(extract=extract_last_number), weight=0.5),
        metric("length", lambda s: len(s.response)),          # weight 0: tracked, not rewarded
    )

Matchers put a short explanation in `Metric.metadata["feedback"]` ("expected 42, got 41"),
which GEPA's reflection reads. `llm_judge(endpoint, rubric=...)` asks any Endpoint to grade the
response and keeps its reasoning as feedback.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias

import trio

from rollouts.agents import rollout
from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.events import StreamEvent

MetricResult: TypeAlias = float | int | bool | tuple[float | int | bool, str] | Metric
MetricFn: TypeAlias = Callable[[Sample], MetricResult | Awaitable[MetricResult]]
Extractor: TypeAlias = Callable[[str], str | None]
ScoreFn: TypeAlias = Callable[[Sample], Awaitable[Score]]


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------


def extract_tag(tag: str = "answer") -> Extractor:
    """An extractor returning the stripped text of the last `<tag>...</tag>` (None if absent)."""
    pattern = re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.S | re.I)

    def extract(text: str) -> str | None:
        found = pattern.findall(text)
        return found[-1].strip() if found else None

    extract.__qualname__ = f"extract_tag({tag!r})"
    return with_form(extract, f"inside <{tag}>...</{tag}> tags", example=f"<{tag}>{{}}</{tag}>")


def with_form(extract: Extractor, form: str, *, example: str | None = None) -> Extractor:
    """`extract` marked with the form of answer it finds ("inside <answer>...</answer> tags"),
    and an example with `{}` for the answer: the matchers' feedback names the expected form, so
    a reader (GEPA's reflection model) can learn it. The built-in extractors carry theirs."""
    extract.rollouts_form = form  # type: ignore[attr-defined]
    extract.rollouts_form_example = example  # type: ignore[attr-defined]
    return extract


def _form(extract: Extractor | None, expected: Any) -> str:
    """` inside <answer>...</answer> tags, e.g. <answer>63</answer>` (or '' for a bare response)."""
    form = getattr(extract, "rollouts_form", None)
    if not form:
        return ""
    example = getattr(extract, "rollouts_form_example", None)
    shown = expected[0] if isinstance(expected, list | tuple) and expected else expected
    return f" {form}" + (f", e.g. {example.format(shown)}" if example and shown is not None else "")


def extract_regex(pattern: str | re.Pattern[str], group: int | str = 1, *, last: bool = True) -> Extractor:
    """An extractor returning `group` of the last (or first) match of `pattern` (None if none)."""
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern

    def extract(text: str) -> str | None:
        matches = list(rx.finditer(text))
        if not matches:
            return None
        m = matches[-1] if last else matches[0]
        value = m.group(group)
        return value.strip() if value is not None else None

    return with_form(extract, f"in text matching the pattern {rx.pattern!r}")


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def extract_last_number(text: str) -> str | None:
    """The last number in `text` ("1,234.5" -> "1234.5"), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


with_form(extract_last_number, "as the last number in the response")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


with_form(extract_boxed, "inside \\boxed{...}", example="\\boxed{{{}}}")


def parse_number(value: Any) -> float | None:
    """`value` as a float ("1,234", "$5", "50%", "3/4" accepted), or None if it is not a number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    s = value.strip().replace(",", "").replace("$", "").rstrip("%").strip()
    if "/" in s:
        num, _, den = s.partition("/")
        try:
            d = float(den)
            return float(num) / d if d != 0 else None
        except ValueError:
            return None
    try:
        f = float(s)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


# --------------------------------------------------------------------------------------------
# Matchers (metric functions)
# --------------------------------------------------------------------------------------------


def _expected(sample: Sample, answer_key: str | None) -> Any:
    if answer_key is None:
        return sample.ground_truth
    return sample.input.get(answer_key)


def _normalize(text: str, case_sensitive: bool) -> str:
    t = " ".join(text.split())
    return t if case_sensitive else t.lower()


def _short(value: Any, limit: int = 200) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def exact_match(
    *, extract: Extractor | None = None, answer_key: str | None = None, case_sensitive: bool = False
) -> MetricFn:
    """1.0 when the (extracted) response equals the expected answer after whitespace
    normalisation (and lower-casing unless `case_sensitive`). The expected answer is the row's
    `ground_truth`/`answer`, or `answer_key`; a list of acceptable answers is allowed."""

    def exact(sample: Sample) -> tuple[float, str]:
        expected = _expected(sample, answer_key)
        if expected is None:
            raise ValueError(
                f"sample {sample.id!r} has no expected answer: add 'ground_truth' or 'answer' to the row, "
                "or pass answer_key= to exact_match"
            )
        got = extract(sample.response) if extract is not None else sample.response
        if got is None:
            return 0.0, f"no answer found in the response: expected {_short(expected)}{_form(extract, expected)}"
        options = expected if isinstance(expected, list | tuple) else [expected]
        ok = any(_normalize(got, case_sensitive) == _normalize(str(o), case_sensitive) for o in options)
        if ok:
            return 1.0, f"correct: {_short(got)}"
        form = getattr(extract, "rollouts_form", None)
        return 0.0, f"expected {_short(expected)}, got {_short(got)}" + (f" ({form})" if form else "")

    return exact


def numeric_match(
    *,
    extract: Extractor | None = extract_last_number,
    answer_key: str | None = None,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
) -> MetricFn:
    """1.0 when the number in the response (by default the last one) equals the expected answer
    within `rel_tol`/`abs_tol`."""

    def numeric(sample: Sample) -> tuple[float, str]:
        expected_raw = _expected(sample, answer_key)
        expected = parse_number(expected_raw)
        if expected is None:
            raise ValueError(
                f"sample {sample.id!r}: expected answer {_short(expected_raw)} is not a number; "
                "use exact_match for non-numeric answers"
            )
        got_text = extract(sample.response) if extract is not None else sample.response
        got = parse_number(got_text) if got_text is not None else None
        if got is None:
            return 0.0, f"no number found in the response: expected {expected:g}{_form(extract, f'{expected:g}')}"
        if math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol):
            return 1.0, f"correct: {got:g}"
        return 0.0, f"expected {expected:g}, got {got:g}"

    return numeric


def contains(*, answer_key: str | None = None, case_sensitive: bool = False) -> MetricFn:
    """1.0 when the expected answer appears anywhere in the response."""

    def contains_answer(sample: Sample) -> tuple[float, str]:
        expected = str(_expected(sample, answer_key))
        ok = _normalize(expected, case_sensitive) in _normalize(sample.response, case_sensitive)
        return (1.0, "the response contains the answer") if ok else (0.0, f"{_short(expected)} not in the response")

    return contains_answer


def regex_match(pattern: str | re.Pattern[str]) -> MetricFn:
    """1.0 when `pattern` matches somewhere in the response (e.g. a required format)."""
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern

    def matches(sample: Sample) -> tuple[float, str]:
        if rx.search(sample.response):
            return 1.0, f"the response matches {rx.pattern!r}"
        return 0.0, f"the response does not match {rx.pattern!r}"

    return matches


# --------------------------------------------------------------------------------------------
# Combinator
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSpec:
    """A named metric function and its weight (0: tracked, not part of the reward)."""

    name: str
    fn: MetricFn
    weight: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a metric needs a name")
        if self.weight < 0:
            raise ValueError(f"metric {self.name!r}: weight must be >= 0, got {self.weight}")


def metric(name: str, fn: MetricFn, weight: float = 0.0) -> MetricSpec:
    """A named, weighted metric function for `combine()`."""
    return MetricSpec(name, fn, weight)


async def _run_metric(spec: MetricSpec, sample: Sample) -> Metric:
    result = spec.fn(sample)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, Metric):
        return Metric(spec.name, result.value, spec.weight, result.metadata)
    feedback: str | None = None
    if isinstance(result, tuple):
        assert len(result) == 2, f"metric {spec.name!r} must return value or (value, feedback), got {result!r}"
        result, feedback = result
    if not isinstance(result, int | float):
        raise TypeError(f"metric {spec.name!r} returned {type(result).__name__}; return a number or (number, feedback)")
    return Metric(spec.name, float(result), spec.weight, {"feedback": feedback} if feedback else {})


def combine(*specs: MetricSpec) -> ScoreFn:
    """A score function computing every metric in order; the reward is their weighted mean
    (metrics with weight > 0). An exception in any metric fails the sample."""
    if not specs:
        raise ValueError("combine() needs at least one metric(...)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"combine(): duplicate metric names {names}")

    async def score(sample: Sample) -> Score:
        return Score(tuple([await _run_metric(s, sample) for s in specs]))

    score.__qualname__ = f"combine({', '.join(names)})"
    return score


# --------------------------------------------------------------------------------------------
# built-in scorers by name (`rollouts eval --score NAME`, the service's batches)
# --------------------------------------------------------------------------------------------

BUILTIN_METRICS: Mapping[str, tuple[Callable[[], MetricFn], str]] = MappingProxyType(
    {  # name -> (metric function factory, what it checks)
        "exact_match": (lambda: exact_match(), "the response equals the row's answer (normalised)"),
        "exact_match_tag": (
            lambda: exact_match(extract=extract_tag("answer")),
            "the text inside <answer>...</answer> equals the row's answer",
        ),
        "boxed_match": (lambda: exact_match(extract=extract_boxed), "the \\boxed{...} answer equals the row's answer"),
        "numeric_match": (lambda: numeric_match(), "the last number in the response equals the answer"),
        "contains": (lambda: contains(), "the row's answer appears in the response"),
    }
)


def builtin_score_fn(names: Sequence[str]) -> ScoreFn:
    """`combine()` of built-in metrics by name (`BUILTIN_METRICS`), each weighted 1: what
    `--score exact_match,contains` means. ValueError naming any unknown name."""
    unknown = [n for n in names if n not in BUILTIN_METRICS]
    if unknown or not names:
        raise ValueError(
            f"unknown scorer {', '.join(unknown) or repr(','.join(names))}; "
            f"built-in scorers: {', '.join(sorted(BUILTIN_METRICS))}"
        )
    return combine(*(metric(n, BUILTIN_METRICS[n][0](), weight=1.0) for n in names))


# --------------------------------------------------------------------------------------------
# LLM judge
# --------------------------------------------------------------------------------------------

JUDGE_PROMPT = """You are grading a model's response.

Rubric:
{rubric}

Task given to the model:
{task}

Reference answer (may be empty):
{reference}

The model's response:
{response}

Explain your reasoning briefly, then give a score from 0 to {max_score} on the last line as
<score>N</score>."""

_SCORE_TAG = extract_tag("score")
_SCORE_LINE = extract_regex(r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)")


def _task_text(sample: Sample) -> str:
    if sample.trajectory is None:
        return ""
    return "\n".join(m.text for m in sample.trajectory.messages if m.role == "user")


async def _ignore(event: StreamEvent) -> None:
    return None


def llm_judge_metric(
    endpoint: Endpoint,
    *,
    rubric: str,
    max_score: float = 10.0,
    prompt_template: str = JUDGE_PROMPT,
    system: str | None = None,
    limiter: trio.CapacityLimiter | None = None,
) -> MetricFn:
    """A metric function asking `endpoint` to grade the sample's response against `rubric`.

    The value is the judge's score divided by `max_score` (clipped to [0, 1]); the judge's text
    is kept as feedback. A reply without a parseable score raises (the sample fails). The call
    goes through `rollout`, so any provider works and evaluate()'s client pool is reused.
    `limiter` bounds concurrent judge calls (the judge is not under evaluate()'s model limit)."""
    if max_score <= 0:
        raise ValueError(f"llm_judge: max_score must be > 0, got {max_score}")

    async def judge(sample: Sample) -> Metric:
        gt = sample.ground_truth
        prompt = prompt_template.format(
            rubric=rubric,
            task=_task_text(sample),
            reference="" if gt is None else str(gt),
            response=sample.response,
            max_score=f"{max_score:g}",
        )
        messages = ((Message("system", system),) if system else ()) + (Message("user", prompt),)
        judge_actor = Actor(Trajectory(messages), endpoint)
        if limiter is not None:
            async with limiter:
                actor = await rollout(judge_actor, _ignore)
        else:
            actor = await rollout(judge_actor, _ignore)
        reply = actor.trajectory.messages[-1].text
        raw = _SCORE_TAG(reply) or _SCORE_LINE(reply)
        value = parse_number(raw) if raw is not None else None
        if value is None:
            raise ValueError(f"the judge gave no score (expected <score>N</score>); its reply: {_short(reply)}")
        usage = actor.trajectory.messages[-1].usage
        meta: dict[str, Any] = {"feedback": reply.strip(), "raw_score": value}
        if usage is not None:
            meta["judge_usage"] = usage.to_dict()
        return Metric("judge", min(1.0, max(0.0, value / max_score)), 0.0, meta)

    return judge


def llm_judge(
    endpoint: Endpoint,
    *,
    rubric: str,
    name: str = "judge",
    weight: float = 1.0,
    max_score: float = 10.0,
    prompt_template: str = JUDGE_PROMPT,
    system: str | None = None,
    extra: Sequence[MetricSpec] = (),
    limiter: trio.CapacityLimiter | None = None,
) -> ScoreFn:
    """A score function whose reward is an LLM judge's grade (see `llm_judge_metric`).

    `extra` adds more metrics alongside the judge, e.g. `(metric("length", fn),)`."""
    judge = metric(
        name,
        llm_judge_metric(
            endpoint,
            rubric=rubric,
            max_score=max_score,
            prompt_template=prompt_template,
            system=system,
            limiter=limiter,
        ),
        weight,
    )
    return combine(judge, *extra)
