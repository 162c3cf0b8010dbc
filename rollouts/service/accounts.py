"""Workspaces, tokens, agents and agent versions: the SQL, as functions of one transaction.

Every read of an agent or version is filtered by workspace: an object of another workspace is
simply not found. The functions return JSON-ready dicts (what the API sends).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollouts.service._db import Tx
from rollouts.service.auth import hash_token, new_token

__all__ = [
    "VersionSpec",
    "add_version",
    "create_agent",
    "create_token",
    "ensure_workspace",
    "get_agent",
    "get_version",
    "list_agents",
    "list_tokens",
    "list_versions",
    "new_id",
    "promote_version",
    "revoke_token",
    "workspace_for_token",
]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass(frozen=True)
class VersionSpec:
    """What an agent version runs: `endpoint` is a model config without the key (provider,
    model, api_base, credential — one the operator configured, which names the variable the key is
    read from and the addresses it may be sent to —, max_tokens, ...); `environment` a built-in environment name or `module:Class` (None: no
    tools)."""

    endpoint: Mapping[str, Any]
    environment: str | None = None
    system_prompt: str = ""
    max_turns: int = 10
    tags: Sequence[str] = field(default_factory=tuple)


# ---- workspaces and tokens ----------------------------------------------------------------------


def ensure_workspace(tx: Tx, name: str) -> str:
    """The id of the workspace called `name`, created if needed."""
    row = tx.one("SELECT id FROM workspaces WHERE name = ?", (name,))
    if row is not None:
        return str(row[0])
    wid = new_id("ws")
    tx.execute(
        f"INSERT INTO workspaces (id, name, created_at) VALUES (?, ?, {tx.dialect.now}) ON CONFLICT (name) DO NOTHING",
        (wid, name),
    )
    row = tx.one("SELECT id FROM workspaces WHERE name = ?", (name,))
    assert row is not None
    return str(row[0])


def create_token(tx: Tx, workspace: str, name: str = "", expires_in_s: float | None = None) -> tuple[str, str]:
    """(token id, token) for the workspace called `workspace` (created if needed). The token is
    returned here once; only its hash is stored."""
    wid = ensure_workspace(tx, workspace)
    token, tid = new_token(), new_id("tok")
    expires = f"{tx.dialect.now} + ?" if expires_in_s is not None else "NULL"
    params: list[Any] = [tid, wid, name, hash_token(token)]
    if expires_in_s is not None:
        params.append(float(expires_in_s))
    tx.execute(
        f"INSERT INTO tokens (id, workspace_id, name, token_hash, created_at, expires_at) "
        f"VALUES (?, ?, ?, ?, {tx.dialect.now}, {expires})",
        params,
    )
    return tid, token


def revoke_token(tx: Tx, token_id: str) -> bool:
    tx.execute(f"UPDATE tokens SET revoked_at = {tx.dialect.now} WHERE id = ? AND revoked_at IS NULL", (token_id,))
    return tx.rowcount == 1


def list_tokens(tx: Tx) -> list[dict[str, Any]]:
    rows = tx.execute(
        "SELECT t.id, w.name, t.name, t.created_at, t.expires_at, t.revoked_at FROM tokens t "
        "JOIN workspaces w ON w.id = t.workspace_id ORDER BY t.created_at"
    )
    keys = ("id", "workspace", "name", "created_at", "expires_at", "revoked_at")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def workspace_for_token(tx: Tx, token: str) -> str | None:
    """The workspace id of a valid (known, not revoked, not expired) token, else None."""
    row = tx.one(
        f"SELECT workspace_id FROM tokens WHERE token_hash = ? AND revoked_at IS NULL "
        f"AND (expires_at IS NULL OR expires_at > {tx.dialect.now})",
        (hash_token(token),),
    )
    return str(row[0]) if row is not None else None


# ---- agents and versions ------------------------------------------------------------------------

_VERSION_COLS = "version, endpoint, environment, system_prompt, max_turns, tags, source, parent_version, created_at"


def _version_dict(agent_id: str, row: Sequence[Any], active: int | None) -> dict[str, Any]:
    version, endpoint, environment, system_prompt, max_turns, tags, source, parent, created = row
    return {
        "agent_id": agent_id,
        "version": int(version),
        "endpoint": json.loads(endpoint),
        "environment": environment,
        "system_prompt": system_prompt,
        "max_turns": int(max_turns),
        "tags": json.loads(tags),
        "source": source,
        "parent_version": parent,
        "active": active == int(version),
        "created_at": created,
    }


def _insert_version(tx: Tx, agent_id: str, version: int, spec: VersionSpec, source: str, parent: int | None) -> None:
    tx.execute(
        f"INSERT INTO agent_versions (agent_id, version, endpoint, environment, system_prompt, max_turns, tags, "
        f"source, parent_version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {tx.dialect.now})",
        (
            agent_id,
            version,
            json.dumps(dict(spec.endpoint), sort_keys=True),
            spec.environment,
            spec.system_prompt,
            spec.max_turns,
            json.dumps(list(spec.tags)),
            source,
            parent,
        ),
    )


def create_agent(tx: Tx, workspace_id: str, name: str, spec: VersionSpec) -> dict[str, Any]:
    """A new agent with version 1 (active)."""
    aid = new_id("ag")
    tx.execute(
        f"INSERT INTO agents (id, workspace_id, name, active_version, created_at) VALUES (?, ?, ?, 1, {tx.dialect.now})",
        (aid, workspace_id, name),
    )
    _insert_version(tx, aid, 1, spec, "api", None)
    agent = get_agent(tx, workspace_id, aid)
    assert agent is not None
    return agent


def _agent_row(tx: Tx, workspace_id: str, agent_id: str) -> tuple[Any, ...] | None:
    return tx.one(
        "SELECT id, name, active_version, created_at FROM agents WHERE id = ? AND workspace_id = ?",
        (agent_id, workspace_id),
    )


def _agent_dict(row: Sequence[Any]) -> dict[str, Any]:
    return {"agent_id": row[0], "name": row[1], "active_version": row[2], "created_at": row[3]}


def list_agents(tx: Tx, workspace_id: str) -> list[dict[str, Any]]:
    rows = tx.execute(
        "SELECT id, name, active_version, created_at FROM agents WHERE workspace_id = ? ORDER BY created_at, id",
        (workspace_id,),
    )
    return [_agent_dict(r) for r in rows]


def get_agent(tx: Tx, workspace_id: str, agent_id: str) -> dict[str, Any] | None:
    """The agent with its active version's settings, or None (unknown, or another workspace's)."""
    row = _agent_row(tx, workspace_id, agent_id)
    if row is None:
        return None
    out = _agent_dict(row)
    out["version"] = get_version(tx, workspace_id, agent_id, None)
    return out


def list_versions(tx: Tx, workspace_id: str, agent_id: str) -> list[dict[str, Any]] | None:
    row = _agent_row(tx, workspace_id, agent_id)
    if row is None:
        return None
    rows = tx.execute(f"SELECT {_VERSION_COLS} FROM agent_versions WHERE agent_id = ? ORDER BY version", (agent_id,))
    return [_version_dict(agent_id, r, row[2]) for r in rows]


def get_version(tx: Tx, workspace_id: str, agent_id: str, version: int | None) -> dict[str, Any] | None:
    """Version `version` of the agent (None: the active one), or None if there is no such thing."""
    row = _agent_row(tx, workspace_id, agent_id)
    if row is None:
        return None
    wanted = row[2] if version is None else version
    vrow = tx.one(f"SELECT {_VERSION_COLS} FROM agent_versions WHERE agent_id = ? AND version = ?", (agent_id, wanted))
    return _version_dict(agent_id, vrow, row[2]) if vrow is not None else None


def add_version(
    tx: Tx,
    workspace_id: str,
    agent_id: str,
    spec: VersionSpec,
    *,
    source: str = "api",
    parent_version: int | None = None,
) -> dict[str, Any] | None:
    """A new version (the next number; not active until promoted), or None for an unknown agent."""
    row = _agent_row(tx, workspace_id, agent_id)
    if row is None:
        return None
    if tx.dialect.is_postgres:
        tx.execute("SELECT id FROM agents WHERE id = ? FOR UPDATE", (agent_id,))  # numbers in order
    top = tx.one("SELECT MAX(version) FROM agent_versions WHERE agent_id = ?", (agent_id,))
    number = int(top[0] or 0) + 1 if top is not None else 1
    _insert_version(tx, agent_id, number, spec, source, parent_version)
    return get_version(tx, workspace_id, agent_id, number)


def promote_version(tx: Tx, workspace_id: str, agent_id: str, version: int) -> dict[str, Any] | None:
    """Make `version` the active one; None when the agent or version does not exist."""
    if get_version(tx, workspace_id, agent_id, version) is None:
        return None
    tx.execute(
        "UPDATE agents SET active_version = ? WHERE id = ? AND workspace_id = ?", (version, agent_id, workspace_id)
    )
    return get_version(tx, workspace_id, agent_id, version)
