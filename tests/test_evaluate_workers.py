"""evaluate(..., executor=WorkerPool(N)) / `rollouts eval --workers N`: samples run in worker processes
through the embedded queue database, with the in-process path's results, output and resume.

Ordering is by events: the fake server (in this process) holds replies on a trio.Event, worker
processes are found as this process's children, and SIGKILL / cancellation happen when the
server or on_sample_end says the run is where the test wants it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import _eval_workers_task as task
import pytest
import trio
import trio.lowlevel
from cli_support import CLI, cli_env, run_cli

from rollouts import Endpoint, EvalConfig, Message, evaluate
from rollouts.errors import AuthenticationError, ConfigurationError
from rollouts.eval.sample import Sample
from rollouts.service.eval_workers import WORKERS_DIR, WorkerPool
from rollouts.testing.fake_server import RecordedRequest, http_error, open_fake_server

KEY = "sk-test-workers-not-a-real-key"


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def _outcomes(samples: Any) -> list[tuple[str, str, float | None]]:
    return [(s.id, s.status, s.score.reward if s.score is not None else None) for s in samples]


def _worker_pids() -> list[int]:
    """This process's children that are evaluate() worker processes."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"rollouts.service.eval_worker" in cmdline:
            found.append(int(entry))
    return found


def _fake_config(base_url: str, out: Path | None, **kw: Any) -> EvalConfig:
    kw.setdefault("show_progress", False)
    return EvalConfig(
        endpoint=Endpoint("openai-compatible", "fake-model", api_base=base_url, api_key=KEY, transport="http"),
        prepare_messages=task.prepare,
        score_fn=task.score,
        output_dir=out,
        **kw,
    )


def _answer(request: RecordedRequest) -> str:
    content = request.json["messages"][-1]["content"]
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    n = int(text.removeprefix("q"))
    return f"<answer>{n + 1 if n % 4 == 0 else n}</answer>"


# --------------------------------------------------------------------------------------------
# Same results as in-process
# --------------------------------------------------------------------------------------------


async def test_scripted_model_results_match_the_in_process_path(tmp_path: Path) -> None:
    rows = [{"q": i, "bad_score": i == 7} for i in range(24)]
    config = EvalConfig(
        endpoint=task.MODEL.endpoint, prepare_messages=task.prepare, score_fn=task.score, show_progress=False
    )
    inproc = await evaluate(rows, replace(config, output_dir=tmp_path / "a"))
    ended: list[str] = []
    parallel = await evaluate(
        rows,
        replace(config, output_dir=tmp_path / "b", on_sample_end=lambda s: ended.append(s.id)),
        executor=WorkerPool(2),
    )
    assert _outcomes(parallel.samples) == _outcomes(inproc.samples)
    assert tuple(parallel.sample_ids) == tuple(inproc.sample_ids) == tuple(str(i) for i in range(24))
    assert parallel.summary["counts"] == inproc.summary["counts"] == {**inproc.summary["counts"], "failed": 1}
    assert parallel.summary["reward"] == inproc.summary["reward"]
    assert sorted(ended) == sorted(parallel.sample_ids)  # on_sample_end ran here, once per sample
    assert sorted(x["id"] for x in _lines(tmp_path / "b")) == sorted(parallel.sample_ids)
    assert "this row's score function fails" in (parallel.samples[7].error or "")
    assert not (tmp_path / "b" / WORKERS_DIR).exists()  # the queue is gone
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["status"] == "completed" and report["sample_ids"] == list(parallel.sample_ids)


async def test_fake_server_results_match_and_rerun_reuses_everything(tmp_path: Path) -> None:
    rows = [{"q": i} for i in range(30)]
    async with open_fake_server(_answer, latency_s=0.01) as srv:
        inproc = await evaluate(rows, _fake_config(srv.base_url, tmp_path / "a", max_concurrent=6))
        assert len(srv.scripted_requests) == 30
        parallel = await evaluate(
            rows, _fake_config(srv.base_url, tmp_path / "b", max_concurrent=6), executor=WorkerPool(2)
        )
        assert len(srv.scripted_requests) == 60
        again = await evaluate(
            rows, _fake_config(srv.base_url, tmp_path / "b", max_concurrent=6), executor=WorkerPool(2)
        )
        assert len(srv.scripted_requests) == 60  # resumed: nothing ran again
    assert _outcomes(parallel.samples) == _outcomes(inproc.samples)
    assert parallel.summary["reward"]["mean"] == inproc.summary["reward"]["mean"] == 22 / 30
    assert again.reused == 30 and _outcomes(again.samples) == _outcomes(inproc.samples)
    assert len(_lines(tmp_path / "b")) == 30
    assert KEY not in (tmp_path / "b" / "samples.jsonl").read_text()


async def test_without_output_dir_and_rescore_with_workers(tmp_path: Path) -> None:
    rows = [{"q": i} for i in range(10)]
    base = EvalConfig(
        endpoint=task.MODEL.endpoint, prepare_messages=task.prepare, score_fn=task.score, show_progress=False
    )
    bare = await evaluate(rows, base, executor=WorkerPool(2))  # (the queue in a temporary directory)
    assert [s.status for s in bare.samples] == ["completed"] * 10
    assert bare.summary["reward"]["mean"] == 0.8
    out = tmp_path / "o"
    await evaluate(rows, replace(base, output_dir=out), executor=WorkerPool(2))
    calls = task.MODEL.calls
    rescored = await evaluate(
        rows, replace(base, output_dir=out, score_fn=task.score_len, rescore=True), executor=WorkerPool(2)
    )
    assert task.MODEL.calls == calls  # (in this process: the parent rescored, no model call anywhere)
    assert rescored.rescored == 10 and rescored.summary["reward"]["mean"] == 1.0


# --------------------------------------------------------------------------------------------
# Faults: a killed worker, Ctrl-C and resume
# --------------------------------------------------------------------------------------------


async def test_sigkill_of_a_worker_mid_run_records_every_sample_once(tmp_path: Path) -> None:
    rows = [{"q": i} for i in range(12)]
    four_in_flight, release = trio.Event(), trio.Event()
    seen = 0

    async def reply(request: RecordedRequest) -> str:
        nonlocal seen
        seen += 1
        if seen == 4:
            four_in_flight.set()
        await release.wait()
        return _answer(request)

    out = tmp_path / "out"
    async with open_fake_server(reply) as srv:
        async with trio.open_nursery() as nursery:
            got: list[Any] = []

            async def run() -> None:
                got.append(
                    await evaluate(rows, _fake_config(srv.base_url, out, max_concurrent=4), executor=WorkerPool(2))
                )

            nursery.start_soon(run)
            await four_in_flight.wait()  # each worker (2 slots each) holds 2 samples, mid model call
            pids = _worker_pids()
            assert len(pids) == 2
            os.kill(pids[0], signal.SIGKILL)
            release.set()
        requests = len(srv.scripted_requests)
    report = got[0]
    assert report.status == "completed"
    assert requests == 14  # the killed worker's 2 samples ran again, nothing else did
    ids = [x["id"] for x in _lines(out)]
    assert sorted(ids) == sorted(str(i) for i in range(12))  # each recorded exactly once
    assert all(x["status"] == "completed" for x in _lines(out))
    assert _outcomes(report.samples)[:5] == [
        ("0", "completed", 0.0),
        ("1", "completed", 1.0),
        ("2", "completed", 1.0),
        ("3", "completed", 1.0),
        ("4", "completed", 0.0),
    ]


async def test_cancel_keeps_finished_samples_and_a_rerun_runs_only_the_rest(tmp_path: Path) -> None:
    rows = [{"q": i} for i in range(20)]
    release = trio.Event()
    served = 0

    async def reply(request: RecordedRequest) -> str:
        nonlocal served
        served += 1
        if served > 5:  # the first 5 answer; the rest wait until the evaluation is cancelled
            await release.wait()
        return _answer(request)

    out = tmp_path / "out"
    async with open_fake_server(reply) as srv:
        scope = trio.CancelScope()
        recorded: list[str] = []

        def on_end(sample: Sample) -> None:
            recorded.append(sample.id)
            if len(recorded) == 5:
                scope.cancel()  # Ctrl-C, as the CLI does it

        with scope:
            await evaluate(
                rows, _fake_config(srv.base_url, out, max_concurrent=2, on_sample_end=on_end), executor=WorkerPool(2)
            )
        assert scope.cancelled_caught
        release.set()
        first = json.loads((out / "report.json").read_text())
        assert first["status"] == "cancelled"
        kept = {x["id"] for x in _lines(out)}
        assert kept == set(recorded) and len(kept) == 5
        assert not (out / WORKERS_DIR).exists()

        before = len(srv.scripted_requests)
        report = await evaluate(rows, _fake_config(srv.base_url, out, max_concurrent=2), executor=WorkerPool(2))
        assert len(srv.scripted_requests) - before == 15  # only the rest ran
    assert report.status == "completed" and report.reused == 5
    assert tuple(report.sample_ids) == tuple(str(i) for i in range(20))
    assert sorted(x["id"] for x in _lines(out)) == sorted(str(i) for i in range(20))


# --------------------------------------------------------------------------------------------
# What cannot cross to a worker process
# --------------------------------------------------------------------------------------------


async def test_callables_that_cannot_cross_processes_are_clear_errors(tmp_path: Path) -> None:
    base = EvalConfig(endpoint=task.MODEL.endpoint, prepare_messages=task.prepare, show_progress=False)

    def local_score(sample: Sample) -> Any:
        return None

    cases = [
        (replace(base, prepare_messages=lambda row: [Message("user", "x")]),
         ["EvalConfig.prepare_messages", "is a lambda", "module level", "in this process"]),
        (replace(base, score_fn=local_score),
         ["EvalConfig.score_fn", "local_score is defined inside a function", "worker_config="]),
        (replace(base, on_sample_event=task.prepare),
         ["EvalConfig.on_sample_event", "another process", "on_sample_end"]),
    ]  # fmt: skip
    for config, needles in cases:
        with pytest.raises(ConfigurationError) as e:
            await evaluate([{"q": 1}], replace(config, output_dir=tmp_path / "x"), executor=WorkerPool(2))
        for needle in needles:
            assert needle in str(e.value), (needle, str(e.value))
    assert not (tmp_path / "x").exists()  # refused before anything was started or written
    with pytest.raises(ConfigurationError, match="workers must be an integer >= 1"):
        WorkerPool(0)


async def test_a_worker_that_cannot_build_its_config_stops_the_evaluation_with_its_error(tmp_path: Path) -> None:
    config = EvalConfig(endpoint=task.MODEL.endpoint, prepare_messages=task.prepare, output_dir=tmp_path / "o")
    with pytest.raises(
        ConfigurationError,
        match=r"a worker process could not build its EvalConfig: ValueError: this worker cannot build its config: "
        r"no such dataset split 'dev'$",
    ):
        await evaluate([{"q": 1}, {"q": 2}], config, executor=WorkerPool(2, worker_config=task.broken_config))
    assert not (tmp_path / "o" / WORKERS_DIR).exists()
    assert json.loads((tmp_path / "o" / "report.json").read_text())["status"] == "failed"


async def test_authentication_error_in_a_worker_stops_the_evaluation(tmp_path: Path) -> None:
    async with open_fake_server(lambda r: http_error(401, message="bad key")) as srv:
        with pytest.raises(AuthenticationError):
            await evaluate(
                [{"q": i} for i in range(6)], _fake_config(srv.base_url, tmp_path / "o"), executor=WorkerPool(2)
            )
    assert json.loads((tmp_path / "o" / "report.json").read_text())["status"] == "failed"
    assert not (tmp_path / "o" / WORKERS_DIR).exists()


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------


def test_cli_workers_match_in_process_and_resume(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "prompt": f"say {i}", "answer": f"say {i}" if i % 3 else "nope"} for i in range(9)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = cli_env(tmp_path)
    common = ("eval", "data.jsonl", "-m", "scripted/echo", "--score", "contains", "--no-progress")
    one = run_cli(*common, "--output", "one", tmp=tmp_path, env=env)
    two = run_cli(*common, "--workers", "2", "--output", "two", tmp=tmp_path, env=env)
    assert one.returncode == two.returncode, (one.stderr, two.stderr)
    assert "9 samples [completed]" in two.stdout, two.stdout + two.stderr

    def outcomes(name: str) -> list[tuple[Any, ...]]:
        lines = _lines(tmp_path / name)
        return sorted((x["id"], x["status"], (x.get("score") or {}).get("reward")) for x in lines)

    assert outcomes("one") == outcomes("two") and len(outcomes("two")) == 9
    again = run_cli(*common, "--workers", "2", "--output", "two", tmp=tmp_path, env=env)
    assert "reused 9" in again.stdout, again.stdout + again.stderr
    bad = run_cli(*common, "--workers", "0", tmp=tmp_path, env=env)
    assert bad.returncode == 2 and "--workers must be at least 1" in bad.stderr


async def test_cli_ctrl_c_with_workers_keeps_finished_samples_and_resumes(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal sends it: the parent stops, the workers
    (which ignore SIGINT) put their tasks back; exit 130; a rerun runs only the rest."""
    rows = [{"id": f"r{i}", "prompt": f"q{i}", "answer": f"<answer>{i}</answer>"} for i in range(9)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = cli_env(tmp_path, TEAM_KEY=KEY)
    fifth, release = trio.Event(), trio.Event()
    served = 0

    async def reply(request: RecordedRequest) -> str:
        nonlocal served
        served += 1
        if served == 5:
            fifth.set()  # 4 in flight at most: a sample has finished in a worker
        if served > 3:
            await release.wait()
        return _answer(request)

    async with open_fake_server(reply) as srv:
        args = ["eval", "data.jsonl", "-m", "openai-compatible/fake-model", "--api-base", srv.base_url,
                "--api-key-env", "TEAM_KEY", "--score", "contains", "--no-progress", "--output", "out",
                "--max-concurrent", "4"]  # fmt: skip
        proc = await trio.lowlevel.open_process(
            [*CLI, *args, "--workers", "2"], cwd=tmp_path, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await fifth.wait()
            os.killpg(proc.pid, signal.SIGINT)
            assert await proc.wait() == 130
        finally:
            if proc.returncode is None:
                proc.kill()
        release.set()
        kept = [x["id"] for x in _lines(tmp_path / "out")]
        assert 1 <= len(kept) == len(set(kept)) <= 4
        assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "cancelled"
        assert not (tmp_path / "out" / WORKERS_DIR).exists()
        before = len(srv.scripted_requests)
        again = await trio.run_process(
            [*CLI, *args, "--workers", "2"], cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True,
            check=False, stdin=b"",
        )  # fmt: skip
        assert again.returncode == 0, again.stderr.decode()[-2000:]
        assert len(srv.scripted_requests) - before == 9 - len(kept)
    assert f"reused {len(kept)}" in again.stdout.decode()
    assert sorted(x["id"] for x in _lines(tmp_path / "out")) == sorted(r["id"] for r in rows)
