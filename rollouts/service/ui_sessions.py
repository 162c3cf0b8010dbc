"""The web UI's sign-in sessions: what its cookie holds instead of the API token.

Signing in with a workspace token starts a session: a random id (`rus_` + 256 bits) goes in
the cookie, the database keeps only its SHA-256 with the token's row, the workspace and an
expiry. A session holds while it has not expired nor been ended (sign-out) and its token is
still valid: revoking the token ends every session started with it, and a copied cookie stops
working at sign-out. The token itself never leaves the login form.

Each function is one transaction's work (`store.call(fn, ...)`); this module is the only
writer of `ui_sessions` (migration 8).
"""

from __future__ import annotations

import hashlib
import secrets

from rollouts.service._db import Tx
from rollouts.service.auth import hash_token

__all__ = ["SESSION_PREFIX", "SESSION_TTL_S", "end_session", "session_workspace", "start_session"]

SESSION_PREFIX = "rus_"
SESSION_TTL_S = 12 * 3600.0  # a sign-in lasts a working day
_KEEP_ENDED_S = 86_400.0  # ended or expired sessions are deleted a day later


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def start_session(tx: Tx, token: str, ttl_s: float = SESSION_TTL_S) -> tuple[str, str] | None:
    """(session id, workspace id) of a new session signed in with `token`, or None when the
    token is not valid (unknown, revoked, expired)."""
    now = tx.dialect.now
    row = tx.one(
        f"SELECT id, workspace_id FROM tokens WHERE token_hash = ? AND revoked_at IS NULL "
        f"AND (expires_at IS NULL OR expires_at > {now})",
        (hash_token(token),),
    )
    if row is None:
        return None
    tx.execute(f"DELETE FROM ui_sessions WHERE expires_at < {now} - ?", (_KEEP_ENDED_S,))
    session_id = SESSION_PREFIX + secrets.token_urlsafe(32)
    tx.execute(
        f"INSERT INTO ui_sessions (id_hash, token_id, workspace_id, created_at, expires_at) "
        f"VALUES (?, ?, ?, {now}, {now} + ?)",
        (_hash(session_id), row[0], row[1], float(ttl_s)),
    )
    return session_id, str(row[1])


def session_workspace(tx: Tx, session_id: str) -> str | None:
    """The workspace of a session that still holds (see the module docstring), else None."""
    now = tx.dialect.now
    row = tx.one(
        f"SELECT s.workspace_id FROM ui_sessions s JOIN tokens t ON t.id = s.token_id "
        f"WHERE s.id_hash = ? AND s.ended_at IS NULL AND s.expires_at > {now} "
        f"AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > {now})",
        (_hash(session_id),),
    )
    return str(row[0]) if row is not None else None


def end_session(tx: Tx, session_id: str) -> bool:
    """End a session (sign-out); False when it had ended already or never existed."""
    tx.execute(
        f"UPDATE ui_sessions SET ended_at = {tx.dialect.now}, expires_at = {tx.dialect.now} "
        "WHERE id_hash = ? AND ended_at IS NULL",
        (_hash(session_id),),
    )
    return tx.rowcount == 1
