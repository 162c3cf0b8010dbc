"""`ServiceClient`: the rollout service's API from Python (async, trio, httpx2).

    async with ServiceClient("http://127.0.0.1:8321", token) as client:
        agent = await client.create_agent("calc", {"model": "openai/gpt-4.1-mini"})
        batch = await client.create_batch(agent["agent_id"], [{"task_id": "1", "user_message": "2+2?"}])
        done = await client.wait_batch(batch["batch_id"], timeout_s=600)
        for r in done["results"]:
            print(r["task_id"], r["status"], r["score"])

Every method is one API call (see docs/service-api.md for the fields) returning the JSON answer
as a dict, except the helpers that wait: `wait_batch`, `wait_gepa`, `batch_results` (every page)
and `cancel_gepa` (until the job has ended). Methods: agents (`create_agent`, `list_agents`,
`get_agent`, `list_versions`, `create_version`, `promote`), batches (`create_batch`,
`get_batch`, `batch_results`, `cancel_batch`, `wait_batch`, `events`), GEPA jobs
(`start_gepa`, `get_gepa`, `cancel_gepa`, `wait_gepa`), and `request` for anything else.

Requests that fail to reach the server (connection refused or reset: a server restarting) are
retried with backoff for up to `reconnect_s`; batch creation is safe to retry because every
batch is sent with an idempotency key. An error answer raises `ServiceError` with the status,
code, message and the offending field.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx2
import trio

__all__ = ["ServiceClient", "ServiceError"]

_TERMINAL_BATCH = ("completed", "partial", "failed", "cancelled")
_TERMINAL_JOB = ("completed", "failed", "cancelled")


class ServiceError(Exception):
    """The service answered with an error."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if message else f"{status} {code}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class ServiceClient:
    """An async client of the rollout service (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        reconnect_s: float = 60.0,
        http: httpx2.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.reconnect_s = reconnect_s
        self._own = http is None
        self._http = http or httpx2.AsyncClient(timeout=timeout_s)
        self._headers = {"authorization": f"Bearer {token}"}

    def __repr__(self) -> str:
        return f"ServiceClient({self.base_url!r})"  # (never the token)

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client (if this client made it); `async with` does it."""
        if self._own:
            with trio.CancelScope(shield=True):
                await self._http.aclose()

    # ---- plumbing -------------------------------------------------------------------------------

    async def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        """One API call; retried while the server cannot be reached or answers 503 (its
        database restarting: after its Retry-After), up to `reconnect_s`."""
        delay = 0.05
        deadline = trio.current_time() + self.reconnect_s
        while True:
            try:
                resp = await self._http.request(
                    method, self.base_url + path, json=body, params=params, headers=self._headers
                )
                retry_after = resp.headers.get("retry-after", "")
                if resp.status_code != 503 or not retry_after or trio.current_time() + delay > deadline:
                    break  # (a 503 without Retry-After is not a passing state: GEPA jobs not run here)
                await trio.sleep(min(float(retry_after), 5.0) if retry_after.isdigit() else delay)
            except (httpx2.ConnectError, httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError):
                if trio.current_time() + delay > deadline:
                    raise
                await trio.sleep(delay)
            delay = min(delay * 2, 2.0)
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code >= 400:
            err = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            raise ServiceError(resp.status_code, err.get("code", "error"), err.get("message", ""), err.get("field"))
        return data

    # ---- agents ---------------------------------------------------------------------------------

    async def create_agent(self, name: str, endpoint: Mapping[str, Any], **version: Any) -> dict[str, Any]:
        """A new agent (version 1). `version` fields: environment, system_prompt, max_turns, tags."""
        return await self.request("POST", "/v1/agents", {"name": name, "endpoint": dict(endpoint), **version})  # type: ignore[no-any-return]

    async def list_agents(self) -> list[dict[str, Any]]:
        """The workspace's agents: each `{agent_id, name, current_version, ...}`."""
        return (await self.request("GET", "/v1/agents"))["agents"]  # type: ignore[no-any-return]

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        """One agent with its current version (`ServiceError` 404 if there is none)."""
        return await self.request("GET", f"/v1/agents/{agent_id}")  # type: ignore[no-any-return]

    async def list_versions(self, agent_id: str) -> list[dict[str, Any]]:
        """Every version of an agent, oldest first (each: endpoint, environment, system_prompt, ...)."""
        return (await self.request("GET", f"/v1/agents/{agent_id}/versions"))["versions"]  # type: ignore[no-any-return]

    async def create_version(self, agent_id: str, **fields: Any) -> dict[str, Any]:
        """A new version of an agent from `fields` (those given replace the current version's:
        endpoint, environment, system_prompt, max_turns, tags); returns it. Not yet current:
        `promote` it."""
        return await self.request("POST", f"/v1/agents/{agent_id}/versions", fields)  # type: ignore[no-any-return]

    async def promote(self, agent_id: str, version: int) -> dict[str, Any]:
        """Make `version` the agent's current one (new batches use it); returns the agent."""
        return await self.request("POST", f"/v1/agents/{agent_id}/versions/{version}/promote")  # type: ignore[no-any-return]

    # ---- batches --------------------------------------------------------------------------------

    async def create_batch(
        self,
        agent_id: str,
        tasks: Sequence[Mapping[str, Any]],
        *,
        system_prompt: str | None = None,
        agent_version: int | None = None,
        config: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Queue a batch: `{batch_id, task_count, status, created_at}`."""
        body: dict[str, Any] = {
            "agent_id": agent_id,
            "tasks": [dict(t) for t in tasks],
            "idempotency_key": idempotency_key or f"client-{secrets.token_hex(12)}",
        }
        if system_prompt is not None:
            body["system_prompt"] = system_prompt
        if agent_version is not None:
            body["agent_version"] = agent_version
        if config:
            body["config"] = dict(config)
        return await self.request("POST", "/v1/batches", body)  # type: ignore[no-any-return]

    async def get_batch(self, batch_id: str, *, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """The batch (`status`, `progress`) with one page of its finished results, from `offset`
        (`next_offset` is None on the last page; `batch_results` reads them all)."""
        return await self.request("GET", f"/v1/batches/{batch_id}", params={"offset": offset, "limit": limit})  # type: ignore[no-any-return]

    async def batch_results(self, batch_id: str, page: int = 1000) -> dict[str, Any]:
        """The batch with every finished result (all pages; `page` results per request, at
        most the API's 1,000)."""
        first = await self.get_batch(batch_id, limit=page)
        results = list(first["results"])
        offset = first["next_offset"]
        while offset is not None:
            more = await self.get_batch(batch_id, offset=offset, limit=page)
            results += more["results"]
            offset = more["next_offset"]
        return {**first, "results": results, "next_offset": None}

    async def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Cancel the batch's unfinished tasks (finished results are kept); returns the batch."""
        return await self.request("DELETE", f"/v1/batches/{batch_id}")  # type: ignore[no-any-return]

    async def events(self, path: str) -> Any:
        """The server-sent events of `path` as (event, data) pairs, until the stream ends."""
        async with self._http.stream("GET", self.base_url + path, headers=self._headers, timeout=None) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                err = resp.json().get("error", {})
                raise ServiceError(resp.status_code, err.get("code", "error"), err.get("message", ""))
            event = "message"
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    yield event, json.loads(line[5:])
                elif not line:
                    event = "message"

    async def wait_batch(self, batch_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Wait until every task of the batch is finished (following its event stream, and
        reconnecting when the server restarts); then the batch with all its results. With
        `timeout_s`, returns what there is when it runs out (unfinished tasks have no result)."""
        with trio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
            while True:
                try:
                    async for event, _ in self.events(f"/v1/batches/{batch_id}/events"):
                        if event == "done":
                            return await self.batch_results(batch_id)
                except (httpx2.TransportError, httpx2.StreamError):
                    pass  # the server went away: look again after a pause
                await trio.sleep(poll_s)
                state = await self.get_batch(batch_id, limit=1)
                if state["progress"]["pending"] == 0:
                    return await self.batch_results(batch_id)
        return await self.batch_results(batch_id)

    # ---- GEPA jobs ------------------------------------------------------------------------------

    async def start_gepa(self, agent_id: str, **request: Any) -> dict[str, Any]:
        """Start a GEPA job (see the GEPARequest schema); returns the job."""
        return await self.request("POST", f"/v1/agents/{agent_id}/gepa", request)  # type: ignore[no-any-return]

    async def get_gepa(self, job_id: str) -> dict[str, Any]:
        """The GEPA job: `status` (queued, running, completed, failed, cancelled), progress and,
        once it has one, its best candidate and score."""
        return await self.request("GET", f"/v1/gepa/{job_id}")  # type: ignore[no-any-return]

    async def cancel_gepa(self, job_id: str, *, wait_s: float = 30.0, poll_s: float = 0.2) -> dict[str, Any]:
        """Cancel the job and return it once it has ended (`status` "cancelled", or "completed"/
        "failed" if it ended first): a running job stops at its next checkpoint, so the DELETE
        alone answers while it is still `running`. Waits at most `wait_s` (0: return the DELETE's
        answer at once); after that, the job as it is then."""
        job: dict[str, Any] = await self.request("DELETE", f"/v1/gepa/{job_id}")
        if wait_s <= 0 or job.get("status") in _TERMINAL_JOB:
            return job
        return await self.wait_gepa(job_id, timeout_s=wait_s, poll_s=poll_s)

    async def wait_gepa(self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll until the job has ended (or `timeout_s` passes); then the job."""
        with trio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
            while True:
                job = await self.get_gepa(job_id)
                if job["status"] in _TERMINAL_JOB:
                    return job
                await trio.sleep(poll_s)
        return await self.get_gepa(job_id)
