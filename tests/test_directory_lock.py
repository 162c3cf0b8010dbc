"""Issue 33 item 6: two runs on one output_dir (evaluate) or one run_dir (GEPA) at once mixed
their results (73 metric calls against a budget of 60; a FileNotFoundError from both writing
`.state.json.<pid>.tmp`). A directory is locked for its writer (an OS file lock, released when
the process dies) and a second writer is refused with a message naming the holder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _gepa_task import TagTask, rows

from rollouts import DirectoryInUseError, EvalConfig, Message, ScriptedModel, evaluate
from rollouts._dirlock import LOCK_FILE, DirectoryLock
from rollouts.gepa import GEPAEvent, optimize

ROOT = Path(__file__).resolve().parent.parent


def _config(model: ScriptedModel, out: Path) -> EvalConfig:
    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        output_dir=out,
        show_progress=False,
    )


async def test_two_runs_on_one_output_dir_the_second_is_refused_naming_the_holder(tmp_path: Path) -> None:
    started, release = trio.Event(), trio.Event()

    async def slow(req: object) -> str:
        started.set()
        await release.wait()
        return "done"

    model = ScriptedModel(slow, name="slow")
    first_report = []

    async def first() -> None:
        first_report.append(await evaluate([{"q": 1}], _config(model, tmp_path)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await started.wait()
        with pytest.raises(DirectoryInUseError) as refused:
            await evaluate([{"q": 1}], _config(ScriptedModel(["x"], name="slow"), tmp_path))
        assert f"process {os.getpid()}" in str(refused.value) and str(tmp_path) in str(refused.value)
        assert "evaluate() output_dir" in str(refused.value)
        release.set()
    assert first_report[0].status == "completed" and first_report[0].samples[0].response == "done"
    # the first run is over: the directory is free again, and its results are reused
    again = await evaluate([{"q": 1}], _config(ScriptedModel([], name="slow"), tmp_path))
    assert again.reused == 1


def test_two_runs_on_one_output_dir_a_lock_dies_with_its_process(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from rollouts._dirlock import DirectoryLock;"
            "lock = DirectoryLock.acquire(pathlib.Path(sys.argv[1]), 'x'); print('locked', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        with pytest.raises(DirectoryInUseError, match=f"process {child.pid} on "):
            DirectoryLock.acquire(tmp_path, "evaluate() output_dir")
    finally:
        child.kill()
        child.wait(timeout=30)
    lock = DirectoryLock.acquire(tmp_path, "evaluate() output_dir")  # released by the kernel
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()  # no file left behind


async def test_two_runs_on_one_gepa_run_dir_the_second_is_refused(tmp_path: Path) -> None:
    running = trio.Event()
    budget = 40

    def on_event(event: GEPAEvent) -> None:
        if event.kind == "evaluation":
            running.set()

    task = TagTask(max_tags=3, latency_s=0.01)
    results = []

    async def first() -> None:
        results.append(
            await optimize(
                task.seed(),
                rows("abcab"),
                rows("abc", "v"),
                task=task.config(),
                reflection_endpoint=task.reflector.endpoint,
                run_dir=tmp_path,
                max_metric_calls=budget,
                callbacks=[on_event],
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await running.wait()
        with pytest.raises(DirectoryInUseError, match=r"GEPA run_dir .* is in use by process"):
            await optimize(
                task.seed(),
                rows("abcab"),
                rows("abc", "v"),
                task=task.config(),
                reflection_endpoint=task.reflector.endpoint,
                run_dir=tmp_path,
                max_metric_calls=budget,
            )
    assert results[0].metric_calls <= budget
    # over: the run_dir is free again (a resume finds nothing left to spend and says so)
    lock = DirectoryLock.acquire(tmp_path, "GEPA run_dir")
    lock.release()
