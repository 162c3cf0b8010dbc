"""The rollout service against in-process evaluate(): throughput, overhead per task, scaling with
worker processes, on SQLite and PostgreSQL; and GEPA through the service vs in-process.

* The provider is the fake server (rollouts.testing) in a SUBPROCESS, answering after
  `--latency` (50 ms): single-turn tasks scored by exact match on an <answer> tag.
* In-process: `evaluate()` over the tasks with `--concurrency` samples in flight.
* Service: the API (this process, hypercorn under trio) + W worker processes
  (`rollouts service worker --concurrency C/W`: the same tasks in flight as in-process, split
  between the workers), W in `--workers` (1, 2, 4), one batch of all the tasks, waited for
  through its event stream; `--repeat` runs of each (5, interleaved), the median reported (a
  1-second run on 2 shared cores swings by 10-20% from one run to the next). Each run has a fresh database; PostgreSQL is a
  throwaway cluster from the system's binaries (`apt-get install -y postgresql`).
* In flight: 300 by default. Enough that the model's latency is not what limits the rate
  (each task holds its slot ~100 ms: 50 ms of latency plus its CPU and the queue's round
  trips, so 300 slots allow ~3,000 tasks/s, above what 2 cores do); with 100 in flight that
  limit was ~1,000 tasks/s, whatever the number of workers, and the scaling figure measured
  it. Few enough that tasks wait in the database until near the end, so workers take them as
  they have room (with 1,000 in flight every task is handed out at the start, and the worker
  that got less of the CPU finishes alone).
* CPU: the worker processes' CPU (from /proc), this process's (API + client) and, on
  PostgreSQL, the server processes'. `overhead_ms_per_task` = (service CPU with 1 worker -
  in-process CPU) / tasks: what the service adds per task, database included.
  `pg_cpu_ms_per_task` and `workers_per_pg_core` (worker CPU per task / PostgreSQL CPU per
  task) say how many fully busy workers one PostgreSQL core serves before it is the bottleneck.
* GEPA on the arithmetic-rules task (../shared/bench/arith_rules.py, or $GEPA_ARITH_RULES):
  the task and reflection models are the fake server's replies, the score runs in a worker;
  in-process optimize() vs optimize() with the ServiceAdapter: best scores and budget.

Run: python benchmarks/service.py [--tasks 1000] [--latency 0.05] [--workers 1,2,4]
     [--dbs sqlite,postgresql] [--concurrency 300] [--repeat 5] [--no-gepa]
Last line: JSON with tasks_per_s_inprocess, tasks_per_s_service_w1/_w2/_w4,
overhead_ms_per_task, db (the database of those figures: PostgreSQL when measured), the same per
database under "by_db", and gepa_best_service / gepa_best_inprocess / gepa_budget_ok.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import trio

from rollouts import Endpoint, EvalConfig, Message, Metric, Sample, Score, evaluate
from rollouts.eval.scorers import combine, exact_match, extract_tag, metric

KEY_ENV = "ROLLOUTS_BENCH_KEY"
RULES_ENV = "GEPA_ARITH_RULES"
DEFAULT_RULES = Path(__file__).resolve().parent.parent / ".." / "shared" / "bench" / "arith_rules.py"
_QUESTION = re.compile(r"What is (-?\d+) (\+|-|\*|/|mod|\^) (-?\d+)\?")
_CLK = os.sysconf("SC_CLK_TCK")
_PROFILE_DIR: Path | None = None  # --profile: worker and fake-server processes run under cProfile


def load_rules() -> ModuleType | None:
    path = Path(os.environ.get(RULES_ENV) or DEFAULT_RULES).resolve()
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("arith_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the fake provider (subprocess) ------------------------------------------------------------


async def _serve(latency_s: float) -> None:
    from rollouts.testing.fake_server import RecordedRequest, open_fake_server

    rules = load_rules()

    def reply(request: RecordedRequest) -> str:
        messages = request.json["messages"]
        text = messages[-1]["content"]
        if rules is not None and text.startswith("I gave an assistant"):
            return str(rules.reflection_model(text))
        m = _QUESTION.fullmatch(text.strip())
        if rules is not None and m is not None:
            system = messages[0]["content"] if messages[0]["role"] == "system" else ""
            return str(rules.task_model(system, {"a": int(m.group(1)), "op": m.group(2), "b": int(m.group(3))}))
        return f"The answer is <answer>{text.rsplit(' ', 1)[-1]}</answer>."

    # (keep_requests=False: a server that kept the ~13,000 requests of a run would grow its heap,
    # and its collector's work, as the runs go on: later runs would meet a slower provider)
    async with open_fake_server(reply, latency_s=latency_s, chunk_size=8, keep_requests=False) as srv:
        print(srv.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


def _profiled(name: str, argv: list[str]) -> list[str]:
    """`argv` (after the interpreter) under cProfile when --profile is given (stats dumped on SIGTERM)."""
    if _PROFILE_DIR is None:
        return argv
    return [__file__, "--profiled", str(_PROFILE_DIR / name), *argv]


def _run_profiled(out: str, argv: list[str]) -> None:
    import cProfile
    import runpy
    import signal

    prof = cProfile.Profile()

    def dump(*_: Any) -> None:
        prof.disable()
        prof.dump_stats(f"{out}.{os.getpid()}.prof")
        os._exit(0)

    signal.signal(signal.SIGTERM, dump)
    sys.argv = argv[1:] if argv[0] == "-m" else argv
    prof.enable()
    if argv[0] == "-m":
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(argv[0], run_name="__main__")


def _stop(proc: subprocess.Popen[Any] | trio.Process) -> None:
    """SIGKILL, or SIGTERM when profiling (the profile is written then)."""
    if _PROFILE_DIR is None:
        proc.kill()
    else:
        proc.terminate()


class FakeProvider:
    def __init__(self, latency_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *_profiled("fake_server", [__file__, "--serve", "--latency", str(latency_s)])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}/v1"

    def stop(self) -> None:
        assert self.proc.stdin is not None
        if _PROFILE_DIR is not None:
            _stop(self.proc)
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ---- CPU accounting -----------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK


def postgres_cpu_s(data_dir: Path) -> float:
    """CPU of the cluster's postmaster and every backend it has now."""
    try:
        master = int((data_dir / "postmaster.pid").read_text().split()[0])
    except OSError:
        return 0.0
    total = proc_cpu_s(master)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[1]) == master:
            total += (int(rest[11]) + int(rest[12])) / _CLK
    return total


# ---- runs ---------------------------------------------------------------------------------------


def _endpoint_spec(base_url: str) -> dict[str, Any]:
    return {"model": "openai-compatible/fake", "api_base": base_url, "credential": "bench", "transport": "http"}


def _write_policy(tmp: Path, base_url: str) -> None:
    """The operator's policy for the runs (read by serve and the workers through the environment):
    credential `bench` (its key in KEY_ENV) reaches the fake provider; GEPA's scorer is this script's."""
    from rollouts.service.policy import POLICY_ENV

    path = tmp / "policy.toml"
    path.write_text(
        f'[credentials.bench]\nkey_env = "{KEY_ENV}"\nbase_urls = ["{base_url}"]\n[imports]\nallow = ["__main__"]\n'
    )
    os.environ[POLICY_ENV] = str(path)


def _tasks(n: int) -> list[dict[str, Any]]:
    return [{"task_id": str(i), "user_message": f"Answer in an <answer> tag: {i}", "context": {"answer": str(i)}} for i in range(n)]  # fmt: skip


async def run_inprocess(base_url: str, n: int, concurrency: int, provider_pid: int) -> dict[str, float]:
    config = EvalConfig(
        endpoint=Endpoint("openai-compatible", "fake", api_base=base_url, api_key="sk-bench", transport="http"),
        prepare_messages=lambda row: [Message("user", row["user_message"])],
        score_fn=combine(metric("exact_match_tag", exact_match(extract=extract_tag("answer")), weight=1.0)),
        max_concurrent=concurrency,
        max_turns=1,
        show_progress=False,
    )
    rows = [{"user_message": t["user_message"], "answer": t["context"]["answer"]} for t in _tasks(n)]
    fake0 = proc_cpu_s(provider_pid)
    cpu0, t0 = time.process_time(), time.perf_counter()
    report = await evaluate(rows, config)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    fake_cpu = proc_cpu_s(provider_pid) - fake0
    assert report.summary["counts"]["completed"] == n, report.summary["counts"]
    return {"wall_s": wall, "cpu_s": cpu, "tasks_per_s": n / wall, "fake_server_cpu_ms_per_task": fake_cpu / n * 1e3}


async def _start_workers(db_url: str, count: int, concurrency: int) -> list[trio.Process]:
    from rollouts.service.server import DB_ENV

    env = {**os.environ, DB_ENV: db_url, KEY_ENV: "sk-bench-" + secrets.token_hex(8)}
    procs = []
    for _ in range(count):
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                *_profiled("worker", ["-m", "rollouts.cli", "service", "worker", "--concurrency", str(concurrency)]),
            ],
            env=env,
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        seen = b""
        while b"ready" not in seen:
            chunk = await proc.stderr.receive_some()
            assert chunk, f"worker failed to start: {seen.decode(errors='replace')}"
            seen += chunk
        procs.append(proc)
    return procs


async def _drain(proc: trio.Process) -> None:
    assert proc.stderr is not None
    while await proc.stderr.receive_some():
        pass


async def run_service(
    db_url: str, provider: FakeProvider, n: int, workers: int, concurrency: int, pg_dir: Path | None
) -> dict[str, float]:
    from rollouts.service import accounts
    from rollouts.service.client import ServiceClient
    from rollouts.service.server import serve
    from rollouts.service.store import Store

    async with trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve(db_url, port=0, gepa_jobs=False, task_status=task_status))
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "bench")
        procs = await _start_workers(db_url, workers, concurrency)
        for p in procs:
            nursery.start_soon(_drain, p)
        client = ServiceClient(url, token)
        try:
            agent = await client.create_agent("bench", _endpoint_spec(provider.base_url), max_turns=1)
            w0 = sum(proc_cpu_s(p.pid) for p in procs)
            fake0 = proc_cpu_s(provider.proc.pid)
            pg0 = postgres_cpu_s(pg_dir) if pg_dir else 0.0
            cpu0, t0 = time.process_time(), time.perf_counter()
            created = await client.create_batch(
                agent["agent_id"], _tasks(n), config={"parallelism": 100_000, "score": "exact_match_tag"}
            )
            done = await client.wait_batch(created["batch_id"])
            wall = time.perf_counter() - t0
            api_cpu = time.process_time() - cpu0
            worker_cpu = sum(proc_cpu_s(p.pid) for p in procs) - w0
            fake_cpu = proc_cpu_s(provider.proc.pid) - fake0
            pg_cpu = (postgres_cpu_s(pg_dir) - pg0) if pg_dir else 0.0
            assert done["progress"]["completed"] == n, done["progress"]
            assert all(r["score"]["reward"] == 1.0 for r in done["results"])
        finally:
            await client.aclose()
            for p in procs:
                _stop(p)
                await p.wait()
            store.close()
            nursery.cancel_scope.cancel()
    return {
        "wall_s": wall,
        "tasks_per_s": n / wall,
        "cpu_s": api_cpu + worker_cpu + pg_cpu,
        "worker_cpu_ms_per_task": worker_cpu / n * 1e3,
        "api_cpu_ms_per_task": api_cpu / n * 1e3,
        "pg_cpu_ms_per_task": pg_cpu / n * 1e3,
        "fake_server_cpu_ms_per_task": fake_cpu / n * 1e3,
    }


# ---- GEPA ---------------------------------------------------------------------------------------

_RULES: ModuleType | None = None


def arith_score(sample: Sample) -> Score:
    """The arithmetic-rules score (run by the worker, imported as __main__:arith_score)."""
    rules = _RULES or load_rules()
    assert rules is not None and sample.trajectory is not None
    system = next((m.text for m in sample.trajectory.messages if m.role == "system"), "")
    value, feedback = rules.score_reply(dict(sample.input), sample.response, system)
    return Score((Metric("correct", float(value), 1.0, {"feedback": feedback}),))


async def run_gepa(db_url: str, base_url: str, budget: int) -> dict[str, Any]:
    from rollouts.gepa import optimize
    from rollouts.service import accounts
    from rollouts.service.batch_tasks import BatchTasks
    from rollouts.service.client import ServiceClient
    from rollouts.service.gepa_adapter import ServiceAdapter
    from rollouts.service.policy import ServicePolicy
    from rollouts.service.server import serve
    from rollouts.service.store import Store
    from rollouts.service.worker import Worker

    rules = _RULES
    assert rules is not None
    train, val = rules.make_dataset(20, seed=1000), rules.make_dataset(20, seed=2000)
    reflector = Endpoint("openai-compatible", "reflect", api_base=base_url, api_key="x", transport="http")
    task = EvalConfig(
        endpoint=Endpoint("openai-compatible", "task", api_base=base_url, api_key="x", transport="http"),
        score_fn=arith_score,
        max_concurrent=64,
        show_progress=False,
    )
    t0 = time.perf_counter()
    local = await optimize(
        rules.SEED_TEXT, train, val, task=task, reflection_endpoint=reflector, max_metric_calls=budget,
        reflection_minibatch_size=3, seed=0,
    )  # fmt: skip
    local_s = time.perf_counter() - t0
    os.environ[KEY_ENV] = "sk-bench"
    async with trio.open_nursery() as nursery:
        url = await nursery.start(lambda task_status: serve(db_url, port=0, gepa_jobs=False, task_status=task_status))
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "gepa")
        await nursery.start(
            Worker(store, run_task=BatchTasks(store, ServicePolicy.from_env()), concurrency=64, max_poll_s=0.05).run
        )
        client = ServiceClient(url, token)
        try:
            agent = await client.create_agent("arith", _endpoint_spec(base_url))
            adapter = ServiceAdapter.over_client(
                client, agent["agent_id"], score="__main__:arith_score", parallelism=64
            )
            t0 = time.perf_counter()
            remote = await optimize(
                rules.SEED_TEXT, train, val, adapter=adapter, reflection_endpoint=reflector, max_metric_calls=budget,
                reflection_minibatch_size=3, seed=0,
            )  # fmt: skip
            remote_s = time.perf_counter() - t0
        finally:
            await client.aclose()
            store.close()
            nursery.cancel_scope.cancel()
    return {
        "gepa_best_inprocess": local.best_score,
        "gepa_best_service": remote.best_score,
        "gepa_metric_calls_service": remote.metric_calls,
        "gepa_tasks_run_service": adapter.tasks_run,
        "gepa_budget": budget,
        "gepa_budget_ok": remote.metric_calls <= budget and adapter.tasks_run == remote.metric_calls,
        "gepa_wall_s_inprocess": round(local_s, 3),
        "gepa_wall_s_service": round(remote_s, 3),
    }


# ---- main ---------------------------------------------------------------------------------------


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median throughput (its CPU figures with it: one consistent run)."""
    return sorted(runs, key=lambda r: r["tasks_per_s"])[len(runs) // 2]


def _fresh_db(kind: str, tmp: Path, pg: Any, n: int) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / f'bench-{n}.db'}"
    import psycopg

    name = f"bench_{n}_{secrets.token_hex(4)}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(pg.url.rsplit("/", 1)[0] + "/" + name)


async def main() -> None:
    global _RULES, _PROFILE_DIR
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument(
        "--concurrency", type=int, default=300, help="tasks in flight: in-process, and over all the workers"
    )
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per database and worker count (the median run is reported)"
    )
    parser.add_argument("--dbs", default="sqlite,postgresql")
    parser.add_argument("--gepa-budget", type=int, default=200)
    parser.add_argument("--no-gepa", action="store_true")
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="run the workers and the fake server under cProfile: DIR/*.prof"
    )
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        _PROFILE_DIR = args.profile.resolve()
    workers = [int(w) for w in args.workers.split(",")]
    dbs = args.dbs.split(",")
    _RULES = load_rules()

    provider = FakeProvider(args.latency)
    tmp = Path(tempfile.mkdtemp(prefix="rollouts-bench-"))
    pg: Any = None
    out: dict[str, Any] = {"tasks": args.tasks, "latency_s": args.latency, "concurrency": args.concurrency}
    _write_policy(tmp, provider.base_url)
    try:
        inproc = await run_inprocess(provider.base_url, args.tasks, args.concurrency, provider.proc.pid)
        print(
            f"in-process: {inproc['tasks_per_s']:.0f} tasks/s, {inproc['cpu_s'] / args.tasks * 1e3:.2f} ms CPU/task "
            f"(fake server {inproc['fake_server_cpu_ms_per_task']:.2f} ms)"
        )
        out["tasks_per_s_inprocess"] = round(inproc["tasks_per_s"], 1)
        out["cpu_ms_per_task_inprocess"] = round(inproc["cpu_s"] / args.tasks * 1e3, 3)
        out["fake_server_cpu_ms_per_task_inprocess"] = round(inproc["fake_server_cpu_ms_per_task"], 3)
        by_db: dict[str, Any] = {}
        counter = 0
        for kind in dbs:
            if kind == "postgresql":
                from rollouts.service.testing import TemporaryPostgres

                pg_root = tempfile.mkdtemp(prefix="rollouts-bench-pg-")  # (the postgres user must reach it)
                pg = TemporaryPostgres(pg_root).start()
            res: dict[str, Any] = {}
            runs_by_w: dict[int, list[dict[str, float]]] = {w: [] for w in workers}
            for _ in range(args.repeat):  # (interleaved: w1, w2, w4, w1, ...: a drift meets them all)
                for w in workers:
                    counter += 1
                    runs_by_w[w].append(
                        await run_service(
                            _fresh_db(kind, tmp, pg, counter),  # (a fresh database each time)
                            provider,
                            args.tasks,
                            w,
                            -(-args.concurrency // w),  # the same tasks in flight in total, split
                            pg.data if kind == "postgresql" else None,
                        )
                    )
            for w in workers:
                runs = runs_by_w[w]
                r = _median_run(runs)
                print(
                    f"{kind} w{w}: {r['tasks_per_s']:.0f} tasks/s, CPU/task: workers {r['worker_cpu_ms_per_task']:.2f} ms, "
                    f"API {r['api_cpu_ms_per_task']:.2f} ms, PostgreSQL {r['pg_cpu_ms_per_task']:.2f} ms, "
                    f"fake server {r['fake_server_cpu_ms_per_task']:.2f} ms"
                )
                res[f"tasks_per_s_service_w{w}"] = round(r["tasks_per_s"], 1)
                res[f"tasks_per_s_service_w{w}_runs"] = [round(x["tasks_per_s"], 1) for x in runs]
                res[f"cpu_ms_per_task_w{w}"] = {  # per process kind: what the 2 cores are spent on
                    part: round(r[f"{part}_cpu_ms_per_task"], 3) for part in ("worker", "api", "pg", "fake_server")
                }
                if w == workers[0]:
                    res["overhead_ms_per_task"] = round((r["cpu_s"] - inproc["cpu_s"]) / args.tasks * 1e3, 3)
                    res["worker_cpu_ms_per_task"] = round(r["worker_cpu_ms_per_task"], 3)
                    res["api_cpu_ms_per_task"] = round(r["api_cpu_ms_per_task"], 3)
                    res["fake_server_cpu_ms_per_task"] = round(r["fake_server_cpu_ms_per_task"], 3)
                    if kind == "postgresql":
                        # PostgreSQL's CPU is read from /proc in clock ticks (10 ms): a tiny run can
                        # show 0, and then there is no ratio to give.
                        res["pg_cpu_ms_per_task"] = round(r["pg_cpu_ms_per_task"], 3)
                        res["workers_per_pg_core"] = (
                            round(r["worker_cpu_ms_per_task"] / r["pg_cpu_ms_per_task"], 1)
                            if r["pg_cpu_ms_per_task"] > 0
                            else None
                        )
            if 1 in workers and 2 in workers:
                res["scaling_w2_over_w1"] = round(res["tasks_per_s_service_w2"] / res["tasks_per_s_service_w1"], 2)
            by_db[kind] = res
        main_db = "postgresql" if "postgresql" in by_db else dbs[0]
        out.update(by_db[main_db])
        out["db"] = main_db
        out["by_db"] = by_db
        if not args.no_gepa and _RULES is not None:
            counter += 1
            g = await run_gepa(_fresh_db(main_db, tmp, pg, counter), provider.base_url, args.gepa_budget)
            print(
                f"GEPA: best in-process {g['gepa_best_inprocess']:.3f}, through the service {g['gepa_best_service']:.3f}"
            )
            out.update(g)
        elif not args.no_gepa:
            print(f"GEPA skipped: {DEFAULT_RULES} not found (set {RULES_ENV})")
    finally:
        provider.stop()
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--profiled"]:
        _run_profiled(sys.argv[2], sys.argv[3:])
    elif "--serve" in sys.argv:
        trio.run(_serve, float(sys.argv[sys.argv.index("--latency") + 1]))
    else:
        trio.run(main)
