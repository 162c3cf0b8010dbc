"""`rollouts view`: serves on 127.0.0.1 and prints the URL; `--bundle` writes static pages
whose links all resolve on disk."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx2
import trio
from _view_data import make_view_data

from rollouts.view import FilesCatalog
from rollouts.view.bundle import write_bundle

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "ROLLOUTS_VIEW_CACHE": str(tmp_path / "cache")}


def test_view_serves_on_localhost_and_prints_the_url(tmp_path: Path) -> None:
    data = trio.run(make_view_data, tmp_path / "data")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollouts.cli", "view", str(data.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"rollouts view: (http://127\.0\.0\.1:\d+/) ", line)
        assert m, line
        with httpx2.Client(base_url=m[1], timeout=30) as client:
            r = client.get(f"/evals/{FilesCatalog.run_id(data.eval_a)}")
            assert r.status_code == 200 and "arith-baseline" in r.text
            assert client.get(f"/sessions/{data.branch_session}").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_view_refuses_a_missing_path(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rollouts.cli", "view", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert r.returncode == 2 and "no such file or directory" in r.stderr


def _links(html: str) -> list[str]:
    return re.findall(r'(?:href|src)="([^"]*)"', html)


async def test_bundle_is_self_contained_with_relative_links(tmp_path: Path) -> None:
    data = await make_view_data(tmp_path / "data")
    out = tmp_path / "bundle"
    written = await write_bundle(FilesCatalog([data.root], cache_dir=tmp_path / "cache"), out)
    names = {p.relative_to(out).as_posix() for p in written}
    assert {"index.html", "sessions.html", "evals.html", "gepa.html", "static/style.css"} <= names
    assert f"sessions/{data.branch_session}.html" in names and f"sessions/{data.branch_session}.diff.html" in names
    run = FilesCatalog.run_id(data.eval_a)
    assert f"evals/{run}.html" in names and f"gepa/{FilesCatalog.run_id(data.gepa)}/c3.html" in names
    checked = 0
    for page in (p for p in written if p.suffix == ".html"):
        html = page.read_text()
        assert "<script" not in html.replace("&lt;script", ""), page  # no scripts: nothing needs a server
        assert "<form" not in html, page
        for link in _links(html):
            assert not link.startswith(("/", "http:", "https:")), (page, link)
            if link.startswith("#"):  # (a place on the same page: the timeline's links to its messages)
                assert f'id="{link[1:]}"' in html, (page, link)
                continue
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.is_file() and out.resolve() in target.parents, (page, link)
            checked += 1
    assert checked > 500


def test_view_bundle_command(tmp_path: Path) -> None:
    data = trio.run(make_view_data, tmp_path / "data")
    out = tmp_path / "b"
    r = subprocess.run(
        [sys.executable, "-m", "rollouts.cli", "view", "--bundle", str(out), str(data.eval_a), str(data.sessions)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert f"open {out / 'index.html'}" in r.stdout
    assert (out / "evals" / f"{FilesCatalog.run_id(data.eval_a)}.html").is_file()
    assert "arith-candidate" not in (out / "evals.html").read_text()  # only the paths given
