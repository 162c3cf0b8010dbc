"""The session stores the files catalog found: each FileSessionStore root indexed in SQLite
(rollouts.view._index.SessionIndex) for the list, its transcripts read through the store's own
reader a window at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import trio

from rollouts.store.base import SessionError, is_session_id
from rollouts.store.files import FileSessionStore
from rollouts.view._index import SessionIndex, index_file
from rollouts.view._indexing import Indexer, Step
from rollouts.view._sql import SESSION_COLS, session_row, session_where
from rollouts.view.catalog import NotFound, Page, SessionDetail, SessionNode, SessionQuery, SessionRow, clamp_page

TREE_MAX = 500  # sessions shown in one branch tree


@dataclass
class _Store:
    path: Path
    index: SessionIndex
    store: FileSessionStore


class SessionStores:
    """Session store roots by path, their indexes in `cache_dir`, kept up to date by `indexer`."""

    def __init__(self, cache_dir: Path, indexer: Indexer) -> None:
        self._cache_dir = cache_dir
        self._indexer = indexer
        self._stores: dict[Path, _Store] = {}

    def add(self, path: Path) -> None:
        if path not in self._stores:
            index = SessionIndex(index_file(self._cache_dir, "sessions", path), path)
            self._stores[path] = _Store(path, index, FileSessionStore(path))

    def steps(self) -> list[Step]:
        return [(s.index.update, 50, 200) for s in self._stores.values()]

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]:
        offset, limit = clamp_page(query.offset, query.limit)
        stores = list(self._stores.values())
        if stores and query == SessionQuery(offset=query.offset, limit=query.limit):
            # the plain list: wait until the first page is indexed (newest sessions come first)
            await self._indexer.wait_for(
                lambda: all(s.index.state("ready") or s.index.count("sessions") >= offset + limit for s in stores), 50
            )
        where, args = session_where(query)

        def run() -> tuple[list[SessionRow], int, bool]:
            rows: list[SessionRow] = []
            total = 0
            for s in stores:
                with s.index.read() as db:
                    total += db.execute(f"SELECT count(*) FROM sessions{where}", args).fetchone()[0]
                    got = db.execute(
                        f"SELECT {SESSION_COLS} FROM sessions s{where} ORDER BY s.id DESC LIMIT ?",
                        [*args, offset + limit],
                    ).fetchall()
                    rows.extend(session_row(r) for r in got)
            rows.sort(key=lambda r: r.session_id, reverse=True)
            return rows[offset : offset + limit], total, all(not s.index.pending() for s in stores)

        items, total, complete = await trio.to_thread.run_sync(run)
        return Page(tuple(items), total, offset, limit, complete)

    def _find(self, session_id: str) -> tuple[_Store, SessionRow]:
        """The store holding `session_id` and its row, brought up to date first (blocking)."""
        if not is_session_id(session_id):
            raise NotFound(f"{session_id!r} is not a session id")
        for s in self._stores.values():
            if not (s.path / session_id / "session.json").is_file():
                continue
            s.index.index_one(session_id)
            with s.index.read() as db:
                r = db.execute(f"SELECT {SESSION_COLS} FROM sessions s WHERE s.id=?", (session_id,)).fetchone()
            if r is not None:
                return s, session_row(r)
        raise NotFound(f"no session {session_id!r}")

    async def files(self, session_id: str) -> list[Path]:
        """The files of session `session_id` (indexed afresh on the way): a change to them is a
        change to its page."""
        s, _ = await trio.to_thread.run_sync(self._find, session_id)
        return [s.path / session_id / "messages.jsonl", s.path / session_id / "session.json"]

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail:
        offset, limit = clamp_page(offset, limit)
        s, row = await trio.to_thread.run_sync(self._find, session_id)
        try:
            messages = await s.store.messages(session_id, offset + limit)
            n = await s.store.message_count(session_id)
        except SessionError as e:
            raise NotFound(str(e)) from None
        tree = await trio.to_thread.run_sync(_tree, s.index, session_id)
        try:
            meta = await trio.to_thread.run_sync(
                lambda: json.loads((s.path / session_id / "session.json").read_text(encoding="utf-8"))
            )
        except (OSError, ValueError):
            meta = {}
        return SessionDetail(row, meta, tuple(messages[offset:]), offset, n, tree)


def _tree(index: SessionIndex, session_id: str) -> SessionNode:
    """The branch tree `session_id` belongs to, from its root (TREE_MAX sessions at most)."""
    with index.read() as db:
        root = session_id
        for _ in range(TREE_MAX):
            r = db.execute("SELECT parent_id FROM sessions WHERE id=?", (root,)).fetchone()
            if r is None or r[0] is None:
                break
            root = r[0]
        budget = [TREE_MAX]

        def node(sid: str) -> SessionNode:
            r = db.execute("SELECT status, branch_point, n_own FROM sessions WHERE id=?", (sid,)).fetchone()
            status, bp, n_own = r if r is not None else ("missing", None, 0)
            kids = []
            for (child,) in db.execute("SELECT id FROM sessions WHERE parent_id=? ORDER BY id", (sid,)).fetchall():
                if budget[0] <= 0:
                    break
                budget[0] -= 1
                kids.append(node(child))
            return SessionNode(sid, status, bp, (bp or 0) + n_own, tuple(kids))

        return node(root)
