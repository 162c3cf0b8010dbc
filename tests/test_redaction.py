"""rollouts.redaction: the secret-field rule, known secret values, the stream redactor (keys cut
across pieces), event redaction (keys cut across deltas), and the writers that use them."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rollouts import redaction
from rollouts.dtypes import Endpoint, Message, ToolCall, ToolResult, Trajectory, Usage
from rollouts.eval.io import SampleLog, write_json_atomic
from rollouts.eval.sample import Sample
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamError,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResultReceived,
)
from rollouts.gepa.checkpoint import JsonlLog
from rollouts.gepa.events import GEPAEvent, ProgressPrinter
from rollouts.redaction import MASK, REDACTED, Redactor, redact_events
from rollouts.store import FileSessionStore

KEY = "sk-unit-REDACTION-0123456789"
OTHER = "sk-unit-REDACTION-other-key"  # shares a long prefix with KEY
LONGER = KEY + "-and-more"  # KEY is the start of another secret


def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_stream_redactor_masks_keys_cut_anywhere_and_equals_whole_text_redaction() -> None:
    r = Redactor([KEY, OTHER, LONGER])
    rng = random.Random(7)
    texts = [
        f"the key is {KEY}.",
        f"{KEY}{OTHER} sk-unit-REDACTION- not a key sk-",
        f"s{KEY[:-1]} almost, then {OTHER}",
        "plain text with no secret at all, ending in s",
        f"a key that starts a longer one: {LONGER} and {KEY}",
    ]
    for text in texts:
        for _ in range(50):
            s = r.stream()
            shown = [s.feed(p) for p in _pieces(text, rng)]
            out = "".join(shown) + s.flush()
            assert out == r.redact(text)
            for i in range(1, len(shown) + 1):  # nothing shown so far ever holds a key, even joined
                assert all(k not in "".join(shown[:i]) for k in (KEY, OTHER, LONGER))
            assert KEY[-6:] not in out and LONGER[-6:] not in out  # no half of a key either


def test_stream_redactor_holds_back_only_what_could_start_a_key() -> None:
    s = Redactor([KEY]).stream()
    assert s.feed("hello sk-un") == "hello "
    assert s.held == "sk-un"
    assert s.feed("known") == "sk-unknown"  # not a key after all: shown at once
    assert s.feed(KEY[:5]) == ""
    assert s.feed(KEY[5:] + " end") == MASK + " end"
    assert s.flush() == ""


def test_redactor_ignores_short_values_and_masks_json_escaped_forms() -> None:
    quoted = 'pa"ss\\word-1234'
    r = Redactor(["EMPTY", "x", quoted, KEY])
    assert r.secrets == (quoted, KEY) or set(r.secrets) == {quoted, KEY}
    text = json.dumps({"a": f"see {quoted} and {KEY}", KEY: 1})
    out = r.redact_json(text)
    assert json.loads(out) == {"a": f"see {MASK} and {MASK}", MASK: 1}
    assert r.redact_value({"k": [f"{KEY}!", (KEY,)], KEY: None}) == {"k": [f"{MASK}!", (MASK,)], MASK: None}


def test_redact_json_never_breaks_json() -> None:
    digits, after_escape, in_unicode = "1234567890", "nsecret-value-1", "00e9-secret-value"
    r = Redactor([digits, after_escape, in_unicode])
    record = {
        "tokens": 12345678901,  # the numeric secret inside a number: left alone
        "text": f"line\n{after_escape[1:]} and {digits}",  # '\n' + 'secret-...' holds 'nsecret-...' encoded
        "accent": "\u00e9-secret-value",  # '\u00e9' encoded holds '00e9-secret-value'
        "real": f"{after_escape} {in_unicode}",
    }
    for text in (json.dumps(record), json.dumps(record, ensure_ascii=False, indent=2)):
        out = json.loads(r.redact_json(text))
        assert out == {
            "tokens": 12345678901,
            "text": f"line\n{after_escape[1:]} and {MASK}",
            "accent": "\u00e9-secret-value",
            "real": f"{MASK} {MASK}",
        }


def test_secret_field_rule() -> None:
    data = {
        "api_key": "k",
        "headers": {"Authorization": "Bearer abc", "X-Api-Key": "v", "Accept": "json"},
        "max_tokens": 5,
        "keepalive": True,
        "author": "a",
        "url": "https://user:pw@h/v1?key=abc&model=m",
    }
    assert redaction.redact_secret_fields(data) == {
        "api_key": REDACTED,
        "headers": {"Authorization": REDACTED, "X-Api-Key": REDACTED, "Accept": "json"},
        "max_tokens": 5,
        "keepalive": True,
        "author": "a",
        "url": f"https://{REDACTED}@h/v1?key={REDACTED}&model=m",
    }


def test_an_endpoint_registers_its_secrets_and_never_serializes_them() -> None:
    header = "hdr-unit-REDACTION-555555"
    bearer = "tok-unit-REDACTION-666666"
    url_key = "url-unit-REDACTION-777777"
    ep = Endpoint(
        "openai",
        "m",
        api_base=f"https://h/v1?key={url_key}",
        api_key=KEY,
        extra_params={"extra_headers": {"X-Team-Key": header, "Authorization": f"Bearer {bearer}"}, "seed": 3},
    )
    known = redaction.known_secrets().secrets
    assert {KEY, header, bearer, url_key} <= set(known)
    d = ep.to_dict()
    assert d["extra_params"] == {"extra_headers": {"X-Team-Key": REDACTED, "Authorization": REDACTED}, "seed": 3}
    assert d["api_base"] == f"https://h/v1?key={REDACTED}"
    assert all(s not in json.dumps(d) for s in (KEY, header, bearer, url_key))
    # read back, the markers are not taken for secrets (they would mask themselves)
    Endpoint.from_dict(d)
    assert REDACTED not in redaction.known_secrets().secrets


def test_provider_key_variables_are_known_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    value = "env-unit-REDACTION-888888"
    assert value not in redaction.known_secrets().secrets
    monkeypatch.setenv("ANTHROPIC_API_KEY", value)
    assert value in redaction.known_secrets().secrets
    monkeypatch.setenv("MY_TEAM_VAR", "team-unit-REDACTION-999999")
    redaction.register_secret_env("MY_TEAM_VAR")
    assert redaction.redact_text("x team-unit-REDACTION-999999 y") == f"x {MASK} y"


async def test_redact_events_masks_keys_cut_across_deltas() -> None:
    r = Redactor([KEY])
    seen: list[StreamEvent] = []

    async def sink(event: StreamEvent) -> None:
        seen.append(event)

    on_chunk = redact_events(sink, r)
    text = f"The key is {KEY}, truly s"
    thinking = f"I know {KEY}"
    args = json.dumps({"note": KEY})
    call = ToolCall("c1", "note", {"note": KEY})
    events: list[StreamEvent] = [LLMCallStart("openai", "m"), StreamStart(), ThinkingStart(0)]
    events += [ThinkingDelta(0, thinking[i : i + 3]) for i in range(0, len(thinking), 3)]
    events += [ThinkingEnd(0, thinking), TextStart(1)]
    events += [TextDelta(1, text[i : i + 2]) for i in range(0, len(text), 2)]
    events += [TextEnd(1, text), ToolCallStart(2, "c1", "note")]
    events += [
        ToolCallDelta(2, "c1", args[i : i + 4], {"note": json.loads(args)["note"]}) for i in range(0, len(args), 4)
    ]
    events += [ToolCallEnd(2, call), StreamDone("tool_use", Usage())]
    events += [ToolResultReceived("c1", "note", ToolResult("c1", content=f"noted {KEY}"))]
    events += [StreamError(f"bad key {KEY}", will_retry=True)]
    for e in events:
        await on_chunk(e)

    assert all(KEY not in repr(e) for e in seen)
    texts = "".join(e.delta for e in seen if isinstance(e, TextDelta))
    thoughts = "".join(e.delta for e in seen if isinstance(e, ThinkingDelta))
    arg_text = "".join(e.delta for e in seen if isinstance(e, ToolCallDelta))
    assert texts == f"The key is {MASK}, truly s"
    assert thoughts == f"I know {MASK}"
    assert json.loads(arg_text) == {"note": MASK}
    assert [type(e).__name__ for e in seen if not isinstance(e, TextDelta | ThinkingDelta | ToolCallDelta)] == [
        type(e).__name__ for e in events if not isinstance(e, TextDelta | ThinkingDelta | ToolCallDelta)
    ]  # the grammar is kept: every held piece is sent before its block ends
    ends = [e for e in seen if isinstance(e, TextEnd | ThinkingEnd | ToolCallEnd)]
    assert ends[1] == TextEnd(1, f"The key is {MASK}, truly s")
    assert isinstance(ends[2], ToolCallEnd) and dict(ends[2].tool_call.arguments) == {"note": MASK}


async def test_writers_mask_known_secrets(tmp_path: Path) -> None:
    redaction.register_secrets(KEY)
    message = Message("assistant", f"here it is: {KEY}")
    sample = Sample(id="s1", input={"q": KEY}, trajectory=Trajectory((message,)), error=f"failed with {KEY}")
    log = SampleLog(tmp_path / "samples.jsonl")
    log.write(sample)
    log.close()
    write_json_atomic(tmp_path / "report.json", {"m": message.to_dict(), KEY: [KEY]})
    gepa_log = JsonlLog(tmp_path / "reflections.jsonl")
    gepa_log.append({"answer": f"use {KEY}"})
    gepa_log.close()
    async with FileSessionStore(tmp_path / "sessions") as store:
        session = await store.create(endpoint=Endpoint("scripted", "echo"), environment_state={"seen": KEY})
        await store.append_message(session.session_id, message, environment_state={"seen": [KEY]})
        await store.update(session.session_id, tags={"note": KEY})
        _, messages = await store.get(session.session_id)
    assert messages[0].text == f"here it is: {MASK}"
    _assert_masked_files(tmp_path, 5)


def _assert_masked_files(root: Path, count: int) -> None:
    written = [p for p in root.rglob("*") if p.is_file()]
    assert len(written) == count
    for path in written:
        text = path.read_text()
        assert KEY not in text and MASK in text, path
        for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
            json.loads(line)


def test_gepa_progress_lines_mask_known_secrets() -> None:
    redaction.register_secrets(KEY)
    out = io.StringIO()
    event = GEPAEvent("iteration_end", 3, 9, None, 0.5, 0, 1, message=f"reflection failed: bad key {KEY}")
    ProgressPrinter(out)(event)
    assert KEY not in out.getvalue() and f"bad key {MASK}" in out.getvalue()


def test_redaction_benchmark_prints_its_figures() -> None:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "redaction.py"), "--repeats", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["line_bytes"] > 300
    assert all(figures[k] > 0 for k in ("redact_json_us", "dumps_us", "feed_us", "feed_held_us", "known_secrets_us"))
