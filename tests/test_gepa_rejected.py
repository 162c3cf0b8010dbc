"""Issue 33 item 14: when no proposal is accepted, show_diff() and the viewer show what was tried
(the rejected proposals with their minibatch scores), instead of only "unchanged"."""

from __future__ import annotations

from pathlib import Path

from _gepa_task import TagTask, rows

from rollouts.gepa import GEPAResult, optimize
from rollouts.view import FilesCatalog
from rollouts.view.links import ServerLinks
from rollouts.view.pages import gepa_run_page


def _useless(_prompt: str) -> str:
    return "Try this:\n```\nAnswer about topics, carefully & <briefly>.\n```"


async def _run(tmp_path: Path) -> GEPAResult:
    task = TagTask(reflection=lambda req: _useless(req.last_user_text))
    return await optimize(
        task.seed(),
        rows("abcabc"),
        rows("abc", "v"),
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=30,
        run_dir=tmp_path / "run",
    )


async def test_show_diff_lists_rejected_proposals_when_no_proposal_is_accepted(tmp_path: Path) -> None:
    result = await _run(tmp_path)
    assert len(result.candidates) == 1 and result.best_idx == 0
    tried = result.rejected_proposals
    assert tried and all(h.proposed == {"system_prompt": "Answer about topics, carefully & <briefly>."} for h in tried)
    diff = result.show_diff()
    assert diff.startswith("=== system_prompt: unchanged\n")
    assert f"=== no proposal was accepted; {len(tried)} tried and rejected:\n" in diff
    h = tried[0]
    assert f"--- iteration {h.iteration} (mutation of [0]): minibatch 0 -> 0 on {len(h.instances)} rows\n" in diff
    assert "+Answer about topics, carefully & <briefly>.\n" in diff and "-Answer about topics.\n" in diff
    assert GEPAResult.from_json(result.to_json()).rejected_proposals == tried  # (kept in result.json)


async def test_the_viewer_shows_the_rejected_proposals(tmp_path: Path) -> None:
    await _run(tmp_path)
    catalog = FilesCatalog([str(tmp_path)])
    runs = await catalog.list_gepa_runs()
    html = await gepa_run_page(catalog, ServerLinks(), runs[0].run_id, {})
    assert "proposed system_prompt" in html
    assert "Answer about topics, carefully &amp; &lt;briefly&gt;." in html  # (escaped)
