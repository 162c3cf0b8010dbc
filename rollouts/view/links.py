"""Where each page lives: URLs for the server, relative file names for a static bundle.

Templates never build URLs themselves; they call a `Links`. `ServerLinks` gives absolute
paths (`/evals/<run>?sort=reward`); `BundleLinks` gives paths relative to the page being
written (`../evals/<run>.html`), and None for what a static copy cannot do (filtering,
later pages), which the templates then leave out.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any
from urllib.parse import quote, urlencode


def _query(params: dict[str, Any]) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return ("?" + urlencode(kept)) if kept else ""


def sample_file_name(sample_id: str) -> str:
    """A sample's file name in a bundle (ids are arbitrary text: hashed)."""
    return hashlib.sha1(sample_id.encode()).hexdigest()[:20]


class ServerLinks:
    """URLs of the running app, optionally under a mount `prefix` (e.g. "/ui")."""

    static_bundle = False

    def __init__(
        self,
        prefix: str = "",
        nav: tuple[tuple[str, str], ...] = (),
        *,
        show_sessions: bool = True,
        show_training: bool | None = None,
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self.nav = nav  # (label, url) of pages a host app adds (the service: batches, GEPA jobs, agents)
        self.show_sessions = show_sessions  # False: the catalog has no sessions (the service): no link to them
        # training runs are directories on disk: shown where sessions are (not in the service)
        self.show_training = show_sessions if show_training is None else show_training

    def _u(self, path: str) -> str:
        return self.prefix + path

    def index(self) -> str:
        return self._u("/")

    def static(self, name: str) -> str:
        return self._u(f"/static/{name}")

    def sessions(self, **query: Any) -> str | None:
        return self._u("/sessions" + _query(query))

    def session(self, session_id: str, **query: Any) -> str | None:
        return self._u(f"/sessions/{quote(session_id, safe='')}" + _query(query))

    def session_diff(self, session_id: str) -> str | None:
        return self._u(f"/sessions/{quote(session_id, safe='')}/diff")

    def evals(self) -> str:
        return self._u("/evals")

    def evals_list(self, **query: Any) -> str | None:
        """The runs list, filtered and sorted."""
        return self._u("/evals" + _query(query))

    def eval_run(self, run_id: str, **query: Any) -> str | None:
        return self._u(f"/evals/{quote(run_id, safe='')}" + _query(query))

    def sample(self, run_id: str, sample_id: str, **query: Any) -> str | None:
        """A sample's page (`query`: the table's filters and the sample's position in them, for
        previous/next)."""
        return self._u(f"/evals/{quote(run_id, safe='')}/samples/{quote(sample_id, safe='')}" + _query(query))

    def compare(self, a: str, b: str, **query: Any) -> str | None:
        return self._u("/compare" + _query({"a": a, "b": b, **query}))

    def compare_form(self) -> str | None:
        """Where the compare form is sent (its fields give the runs)."""
        return self._u("/compare")

    def sharing(self, run_id: str) -> str | None:
        """JSON: the runs that share sample ids with `run_id` (what the compare form offers)."""
        return self._u(f"/api/evals/{quote(run_id, safe='')}/sharing")

    def compare_runs(self, run_ids: list[str], vs: str, **query: Any) -> str | None:
        """N runs side by side, the first the baseline; the sample table against `vs`."""
        return self._u("/compare" + _query({"runs": ",".join(run_ids), "vs": vs, **query}))

    def eval_set(self, set_id: str) -> str | None:
        return self._u(f"/sets/{quote(set_id, safe='')}")

    def training_runs(self) -> str:
        return self._u("/training")

    def training_run(self, run_id: str, **query: Any) -> str | None:
        return self._u(f"/training/{quote(run_id, safe='')}" + _query(query))

    def gepa_runs(self) -> str:
        return self._u("/gepa")

    def gepa_run(self, run_id: str) -> str | None:
        return self._u(f"/gepa/{quote(run_id, safe='')}")

    def candidate(self, run_id: str, idx: int) -> str | None:
        return self._u(f"/gepa/{quote(run_id, safe='')}/candidates/{int(idx)}")

    def live(self, kind: str, item_id: str, **query: Any) -> str | None:
        """The live stream of an item (`query`: the page's filters, for the rows it shows)."""
        return self._u(f"/live/{kind}/{quote(item_id, safe='')}" + _query(query))

    def sample_text(self, run_id: str, sample_id: str, message: int, part: int) -> str | None:
        """The whole text of one part of one message of a sample (plain text)."""
        return self._u("/text/sample" + _query({"run": run_id, "id": sample_id, "m": str(message), "p": str(part)}))

    def session_text(self, session_id: str, message: int, part: int) -> str | None:
        return self._u("/text/session" + _query({"id": session_id, "m": str(message), "p": str(part)}))


class BundleLinks:
    """Relative links between the files of a static bundle, from the page at `current`
    (a path such as "evals/run-ab12cd.html"). `include` decides which pages exist."""

    static_bundle = True
    nav: tuple[tuple[str, str], ...] = ()
    show_sessions = True
    show_training = True

    def __init__(
        self,
        current: str,
        *,
        sessions: set[str] | None = None,
        samples: set[tuple[str, str]] | None = None,
        runs: set[str] | None = None,
    ) -> None:
        self.current = current
        self._sessions = sessions
        self._samples = samples
        self._runs = runs  # the eval runs that have a page (a training step's samples have none)

    def _rel(self, target: str) -> str:
        return posixpath.relpath(target, posixpath.dirname(self.current) or ".")

    def index(self) -> str:
        return self._rel("index.html")

    def static(self, name: str) -> str:
        return self._rel(f"static/{name}")

    def sessions(self, **query: Any) -> str | None:
        return None if _query(query) else self._rel("sessions.html")

    def session(self, session_id: str, **query: Any) -> str | None:
        if _query(query) or (self._sessions is not None and session_id not in self._sessions):
            return None
        return self._rel(f"sessions/{session_id}.html")

    def session_diff(self, session_id: str) -> str | None:
        if self._sessions is not None and session_id not in self._sessions:
            return None
        return self._rel(f"sessions/{session_id}.diff.html")

    def evals(self) -> str:
        return self._rel("evals.html")

    def evals_list(self, **query: Any) -> str | None:
        return None if _query(query) else self._rel("evals.html")

    def eval_run(self, run_id: str, **query: Any) -> str | None:
        if _query(query) or (self._runs is not None and run_id not in self._runs):
            return None
        return self._rel(f"evals/{run_id}.html")

    def sample(self, run_id: str, sample_id: str, **query: Any) -> str | None:
        if self._samples is not None and (run_id, sample_id) not in self._samples:
            return None
        return self._rel(f"evals/{run_id}/{sample_file_name(sample_id)}.html")

    def compare(self, a: str, b: str, **query: Any) -> str | None:
        return None

    def compare_form(self) -> str | None:
        return None

    def sharing(self, run_id: str) -> str | None:
        return None

    def compare_runs(self, run_ids: list[str], vs: str, **query: Any) -> str | None:
        return None

    def eval_set(self, set_id: str) -> str | None:
        return self._rel(f"sets/{set_id}.html")

    def training_runs(self) -> str:
        return self._rel("training.html")

    def training_run(self, run_id: str, **query: Any) -> str | None:
        return None if _query(query) else self._rel(f"training/{run_id}.html")

    def gepa_runs(self) -> str:
        return self._rel("gepa.html")

    def gepa_run(self, run_id: str) -> str | None:
        return self._rel(f"gepa/{run_id}.html")

    def candidate(self, run_id: str, idx: int) -> str | None:
        return self._rel(f"gepa/{run_id}/c{int(idx)}.html")

    def live(self, kind: str, item_id: str, **query: Any) -> str | None:
        return None

    def sample_text(self, run_id: str, sample_id: str, message: int, part: int) -> str | None:
        return None

    def session_text(self, session_id: str, message: int, part: int) -> str | None:
        return None


Links = ServerLinks | BundleLinks
