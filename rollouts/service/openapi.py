"""The API's OpenAPI 3.1 schema (served at /v1/openapi.json) and its Markdown rendering (the
API reference in docs/service-api.md is generated from it: `python -m rollouts.service.openapi`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["openapi", "openapi_markdown"]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


_S = {"type": "string"}
_I = {"type": "integer"}
_N = {"type": "number"}
_T = {"type": "string", "format": "date-time"}

SCHEMAS: dict[str, Any] = {
    "Error": _obj(
        {
            "error": _obj(
                {
                    "code": _S,
                    "message": _S,
                    "field": {**_S, "description": "the offending field, e.g. tasks[3].task_id"},
                },
                ["code", "message"],
            )
        },
        ["error"],
    ),
    "Endpoint": _obj(
        {
            "model": {**_S, "description": "provider/model, e.g. openai/gpt-4.1-mini"},
            "provider": _S,
            "api_base": {**_S, "description": "an address the credential lists (none: the provider's own API)"},
            "credential": {
                **_S,
                "description": "a credential the operator configured (default: the one named after the provider)",
            },
            "max_tokens": _I,
            "temperature": _N,
            "max_retries": _I,
            "timeout": _N,
            "transport": {"enum": ["sdk", "http"]},
            "extra_params": {"type": "object", "description": "sampling parameters the operator's policy allows"},
        },
        ["model"],
    ),
    "VersionInput": _obj(
        {
            "endpoint": _ref("Endpoint"),
            "environment": {**_S, "description": "basic, calculator, none or module:Class"},
            "system_prompt": _S,
            "max_turns": _I,
            "tags": {"type": "array", "items": _S},
            "parent_version": {
                **_I,
                "description": "the version this one derives from (default: the active one); "
                "fields not given come from it",
            },
        }
    ),
    "AgentInput": _obj(
        {
            "name": _S,
            "endpoint": _ref("Endpoint"),
            "environment": {**_S, "description": "basic, calculator, none or module:Class"},
            "system_prompt": _S,
            "max_turns": {**_I, "default": 10},
            "tags": {"type": "array", "items": _S},
        },
        ["name", "endpoint"],
    ),
    "AgentList": _obj({"agents": {"type": "array", "items": _ref("Agent")}}),
    "VersionList": _obj({"versions": {"type": "array", "items": _ref("AgentVersion")}}),
    "AgentVersion": _obj(
        {
            "agent_id": _S,
            "version": _I,
            "endpoint": _ref("Endpoint"),
            "environment": _S,
            "system_prompt": _S,
            "max_turns": _I,
            "tags": {"type": "array", "items": _S},
            "source": {**_S, "description": "api or gepa"},
            "parent_version": _I,
            "active": {"type": "boolean"},
            "created_at": _T,
        }
    ),
    "Agent": _obj(
        {"agent_id": _S, "name": _S, "active_version": _I, "created_at": _T, "version": _ref("AgentVersion")}
    ),
    "Task": _obj(
        {
            "task_id": _S,
            "user_message": _S,
            "messages": {"type": "array", "items": {"type": "object"}, "description": "Message JSON"},
            "context": {"type": "object", "description": "free data; scorers read `answer` from it"},
        },
        ["task_id"],
    ),
    "BatchRequest": _obj(
        {
            "agent_id": _S,
            "agent_version": {**_I, "description": "default: the active version"},
            "system_prompt": {**_S, "description": "default: the version's"},
            "tasks": {"type": "array", "items": _ref("Task")},
            "idempotency_key": {
                **_S,
                "description": "a retry (the same body) with the same key returns the first batch; "
                "the key with another body is 409",
            },
            "config": _obj(
                {
                    "parallelism": {**_I, "default": 5},
                    "timeout_per_task_ms": {
                        **_I,
                        "description": "default: 30000 for a hosted model, 600000 for a local one (local, llamacpp, "
                        "transformers)",
                    },
                    "deadline_s": {**_N, "default": 600, "description": "then unfinished tasks are `timeout`"},
                    "model": {**_S, "description": "overrides the version's model"},
                    "score": {**_S, "description": "built-in scorer name(s) or module:function"},
                }
            ),
        },
        ["agent_id", "tasks"],
    ),
    "BatchCreated": _obj({"batch_id": _S, "task_count": _I, "status": {"const": "queued"}, "created_at": _T}),
    "Result": _obj(
        {
            "task_id": _S,
            "status": {"enum": ["completed", "failed", "timeout", "cancelled"]},
            "trajectory": {"type": "object", "description": "Trajectory JSON"},
            "score": {"type": "object"},
            "stop_reason": _S,
            "error": _S,
            "execution_time_ms": _I,
            "attempts": _I,
            "finished_at": _T,
        }
    ),
    "Batch": _obj(
        {
            "batch_id": _S,
            "agent_id": _S,
            "agent_version": _I,
            "status": {"enum": ["queued", "running", "completed", "partial", "failed", "cancelled"]},
            "progress": _obj(
                {"total": _I, "completed": _I, "failed": _I, "timeout": _I, "cancelled": _I, "pending": _I}
            ),
            "results": {"type": "array", "items": _ref("Result")},
            "next_offset": {**_I, "description": "null on the last page"},
            "created_at": _T,
            "deadline_at": _T,
            "completed_at": _T,
        }
    ),
    "GEPARequest": _obj(
        {
            "trainset": {"type": "array", "items": _ref("Task")},
            "valset": {"type": "array", "items": _ref("Task"), "description": "default: the trainset"},
            "score": {**_S, "description": "built-in scorer name(s) or module:function (run by the workers)"},
            "max_metric_calls": _I,
            "parallelism": _I,
            "poll_timeout_s": {**_N, "description": "each evaluation batch's deadline"},
            "timeout_per_task_ms": {
                **_I,
                "description": "default: 30000 for a hosted model, 600000 for a local one (local, llamacpp, "
                "transformers); timed-out tasks score 0 and are counted in the job's `timeouts`",
            },
            "score_threshold": _N,
            "reflection_model": _ref("Endpoint"),
            "seed_prompt": {**_S, "description": "default: the agent version's system prompt"},
            "agent_version": _I,
            "minibatch_size": _I,
            "seed": _I,
            "promote": {"type": "boolean", "description": "make the new version active on completion"},
        },
        ["trainset", "score", "max_metric_calls", "reflection_model"],
    ),
    "GEPAJob": _obj(
        {
            "job_id": _S,
            "agent_id": _S,
            "status": {"enum": ["queued", "running", "completed", "failed", "cancelled"]},
            "metric_calls": _I,
            "max_metric_calls": _I,
            "best_score": _N,
            "best_prompt": _S,
            "candidates": _I,
            "lineage": {"type": "array", "items": {"type": "object"}},
            "created_version": {**_I, "description": "the new version (none when nothing beat the seed)"},
            "error": {**_S, "description": "why the job failed"},
            "message": {**_S, "description": "how it ended beside its status: no version made, tasks timed out"},
            "timeouts": {**_I, "description": "evaluated tasks that timed out (each scored 0)"},
            "created_at": _T,
            "completed_at": _T,
        }
    ),
}


def _op(summary: str, ok: str | None, *, body: str | None = None, code: str = "200", params: list[str] = (), query: list[str] = (), sse: bool = False) -> dict[str, Any]:  # type: ignore[assignment]  # fmt: skip
    op: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}], "responses": {}}
    parameters = [{"name": p, "in": "path", "required": True, "schema": _S} for p in params]
    parameters += [{"name": q, "in": "query", "required": False, "schema": _I} for q in query]
    if parameters:
        op["parameters"] = parameters
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    if sse:
        op["responses"][code] = {
            "description": "server-sent events: progress ..., then done",
            "content": {"text/event-stream": {}},
        }
    elif ok:
        op["responses"][code] = {"description": "OK", "content": {"application/json": {"schema": _ref(ok)}}}
    err = {"content": {"application/json": {"schema": _ref("Error")}}}
    op["responses"]["401"] = {"description": "no valid token", **err}
    if params:
        op["responses"]["404"] = {"description": "not found (or another workspace's)", **err}
    if body:
        op["responses"]["400"] = {"description": "malformed JSON", **err}
        op["responses"]["413"] = {"description": "body too large", **err}
        op["responses"]["422"] = {"description": "invalid field (named in error.field)", **err}
    return op


def _conflict(op: dict[str, Any]) -> dict[str, Any]:
    op["responses"]["409"] = {
        "description": "the idempotency key was used for a different request",
        "content": {"application/json": {"schema": _ref("Error")}},
    }
    return op


def openapi() -> dict[str, Any]:
    """The OpenAPI document."""
    a, v, b, j = ["agent_id"], ["agent_id", "version"], ["batch_id"], ["job_id"]
    paths = {
        "/v1/agents": {
            "post": _op("Create an agent (its version 1, active)", "Agent", body="AgentInput", code="201"),
            "get": _op("List the workspace's agents", "AgentList"),
        },
        "/v1/agents/{agent_id}": {"get": _op("An agent with its active version", "Agent", params=a)},
        "/v1/agents/{agent_id}/versions": {
            "get": _op("An agent's versions", "VersionList", params=a),
            "post": _op("Add a version (fields not given come from its parent; unknown fields and `source` are 422)", "AgentVersion", body="VersionInput", code="201", params=a),
        },
        "/v1/agents/{agent_id}/versions/{version}": {"get": _op("One version", "AgentVersion", params=v)},
        "/v1/agents/{agent_id}/versions/{version}/promote": {"post": _op("Make a version the active one", "AgentVersion", params=v)},
        "/v1/agents/{agent_id}/gepa": {"post": _op("Start a GEPA job on the agent", "GEPAJob", body="GEPARequest", code="201", params=a)},
        "/v1/batches": {"post": _conflict(_op("Queue a batch of rollouts", "BatchCreated", body="BatchRequest", code="201"))},
        "/v1/batches/{batch_id}": {
            "get": _op("Status, progress and results (paginated: offset, limit)", "Batch", params=b, query=["offset", "limit"]),
            "delete": _op("Cancel what is queued or running", "Batch", params=b),
        },
        "/v1/batches/{batch_id}/events": {"get": _op("Progress as server-sent events", None, params=b, sse=True)},
        "/v1/gepa/{job_id}": {
            "get": _op("A GEPA job's status", "GEPAJob", params=j),
            "delete": _op("Cancel a GEPA job", "GEPAJob", params=j),
        },
        "/v1/gepa/{job_id}/events": {"get": _op("A GEPA job's progress as server-sent events", None, params=j, sse=True)},
    }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "rollouts service", "version": "1"},
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _type(s: dict[str, Any]) -> str:
    if "$ref" in s:
        ref: str = s["$ref"]
        return ref.rsplit("/", 1)[1]
    if "enum" in s:
        return " \\| ".join(json.dumps(x) for x in s["enum"])
    if "const" in s:
        return json.dumps(s["const"])
    if s.get("type") == "array":
        return f"array of {_type(s.get('items', {}))}"
    return str(s.get("format") or s.get("type", "any"))


def openapi_markdown(doc: dict[str, Any] | None = None) -> str:
    """The API reference as Markdown."""
    doc = doc or openapi()
    out = ["# Rollout service API reference", "", "Generated from the OpenAPI schema (`GET /v1/openapi.json`).", ""]
    out += [
        'Every route needs `Authorization: Bearer <token>`. Errors are `{"error": {"code", "message", "field"?}}`.',
        "",
    ]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out.append(f"## `{method.upper()} {path}`")
            out.append("")
            out.append(op["summary"] + ".")
            body = op.get("requestBody")
            if body:
                out.append(f"Body: `{_type(body['content']['application/json']['schema'])}`.")
            codes = ", ".join(
                f"{c} {_type(r['content']['application/json']['schema']) if 'application/json' in r.get('content', {}) else r['description']}"
                for c, r in op["responses"].items()
            )
            out.append(f"Responses: {codes}.")
            out.append("")
    out.append("## Schemas")
    out.append("")
    for name, schema in doc["components"]["schemas"].items():
        out.append(f"### {name}")
        out.append("")
        required = set(schema.get("required", ()))
        out.append("| field | type | notes |")
        out.append("| --- | --- | --- |")
        for field, s in schema.get("properties", {}).items():
            notes = s.get("description", "")
            if "default" in s:
                notes = f"default {json.dumps(s['default'])}. {notes}".strip()
            if field in required:
                notes = f"required. {notes}".strip()
            if s.get("type") == "object" and "properties" in s:
                notes = (notes + " fields: " + "; ".join(_nested(k, v) for k, v in s["properties"].items())).strip()
            out.append(f"| `{field}` | {_type(s)} | {notes} |")
        out.append("")
    return "\n".join(out)


def _nested(name: str, schema: Mapping[str, Any]) -> str:
    """A field of an object field: its name, with its default and description if it has them."""
    notes = [f"default {json.dumps(schema['default'])}"] if "default" in schema else []
    notes += [schema["description"]] if schema.get("description") else []
    return f"{name} ({', '.join(notes)})" if notes else name


if __name__ == "__main__":
    sys.stdout.write(openapi_markdown())
