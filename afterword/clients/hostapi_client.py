"""A Python client of the host API: the app handle's run binding over loopback HTTP.

:class:`HostClient` mirrors the in-process handle, so a host written against
``service.begin_run(...)`` runs unchanged against an ``afterword serve`` sidecar::

    async with HostClient(base_url, host_token) as host:
        run = await host.begin_run(run_id, conversation_id, reply_to)
        env = run.stdio_env("work-control", base_env)
        ...
        await run.finalize(history)
        await run.activate()

Errors come back as the same typed errors the handle raises (:class:`InvalidRequest`,
:class:`Conflict`, :class:`Closed`, ...), chosen by the error envelope's code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import httpx
import msgspec

from ..continuations import errors as E
from ..protocol import paths
from ..protocol.headers import RESERVED_ENV, RESERVED_HEADERS, strip_reserved_env, strip_reserved_headers
from ..protocol.hostapi_wire import CapturedTextBody, RunBody
from ..protocol.tasks import AdoptedTask, AdoptTaskRequest, TaskHandle, TaskOutcome, TaskReport
from ..protocol.wire import HealthBody, ListResponse, StatusBody

T = TypeVar("T")
_enc = msgspec.json.Encoder()
_JSON = {"Content-Type": "application/json"}
_ERRORS: dict[str, type[E.ContinuationError]] = {
    "invalid_request": E.InvalidRequest,
    "unauthorized": E.Unauthorized,
    "forbidden": E.Forbidden,
    "not_found": E.NotFound,
    "conflict": E.Conflict,
    "closed": E.Closed,
    "too_large": E.RequestTooLarge,
    "admission_limit": E.AdmissionLimit,
    "unavailable": E.Unavailable,
}


class HostApiError(E.ContinuationError):
    """An answer with no typed counterpart (5xx, or the service unreachable: ``status`` 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        super().__init__(message)


class HostClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self._base = base_url.rstrip("/")
        # trust_env=False: the host capability goes to the loopback service only, never to a
        # proxy named in the environment.
        self._client = httpx.AsyncClient(
            timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}, trust_env=False
        )

    def __repr__(self) -> str:
        return f"<HostClient {self._base}>"

    async def __aenter__(self) -> HostClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, kind: type[T], **kw: Any) -> T:
        try:
            resp = await self._client.request(method, self._base + path, **kw)
        except httpx.HTTPError as exc:
            raise HostApiError(
                0, "unreachable", f"cannot reach {self._base} ({type(exc).__name__})"
            ) from None
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                code, message = "internal", f"HTTP {resp.status_code}"
            error = _ERRORS.get(code)
            if code == "closed" and resp.status_code == 409:
                error = E.RunClosed  # closed but not settled (a settled run answers 410)
            raise error(message) if error is not None else HostApiError(resp.status_code, code, message)
        return msgspec.json.decode(resp.content, type=kind)

    async def begin_run(
        self, run_id: str, conversation_id: str, reply_to: str | None, mode: str = "reply"
    ) -> RemoteRun:
        body = {"runId": run_id, "conversationId": conversation_id, "replyTo": reply_to, "mode": mode}
        return RemoteRun(self, await self.call("POST", paths.HOST_RUNS, RunBody, json=body))

    async def get_run(self, run_id: str) -> RemoteRun:
        return RemoteRun(self, await self.call("GET", paths.url(paths.HOST_RUN, run_id=run_id), RunBody))

    # -- the handle's continuation operations ----------------------------------------------
    async def continuation_health(self) -> HealthBody:
        return await self.call("GET", paths.HOST_HEALTH, HealthBody)

    async def list_continuations(self, limit: int | None = None, cursor: str | None = None) -> ListResponse:
        params = {k: str(v) for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
        return await self.call("GET", paths.HOST_LIST, ListResponse, params=params)

    async def captured_continuation_text(self, cid: str) -> str | None:
        path = paths.url(paths.HOST_CAPTURED_TEXT, cid=cid)
        return (await self.call("GET", path, CapturedTextBody)).text

    async def retry_continuation(self, cid: str, allow_unknown: bool = False) -> StatusBody:
        path = paths.url(paths.HOST_RETRY, cid=cid)
        return await self.call("POST", path, StatusBody, json={"allowUnknown": allow_unknown})

    async def cancel_continuation(self, cid: str) -> StatusBody:
        return await self.call("POST", paths.url(paths.HOST_CANCEL, cid=cid), StatusBody)

    async def report_task_outcome(self, cid: str, outcome: TaskOutcome) -> TaskReport:
        """Hand one answer of ``tasks/get`` for a host-followed task to the service; the
        report says whether to send ``tasks/cancel``."""
        path = paths.url(paths.HOST_TASK_OUTCOME, cid=cid)
        return await self.call("POST", path, TaskReport, content=_enc.encode(outcome), headers=_JSON)

    async def resolve_continuation_delivery(self, cid: str, resolution: Mapping[str, Any]) -> StatusBody:
        body = {"kind": resolution["kind"]}
        delivery_id = resolution.get("deliveryId") or resolution.get("delivery_id")
        if delivery_id is not None:
            body["deliveryId"] = delivery_id
        return await self.call("POST", paths.url(paths.HOST_RESOLVE, cid=cid), StatusBody, json=body)


class RemoteRun:
    """One run bound over the host API, with the same methods as the in-process RunBinding."""

    def __init__(self, client: HostClient, body: RunBody) -> None:
        self._client = client
        self.body = body

    def __repr__(self) -> str:
        return f"<RemoteRun run={self.run_id!r} state={self.body.state}>"

    @property
    def run_id(self) -> str:
        return self.body.run_id

    @property
    def servers(self) -> list[str]:
        return [s.server for s in self.body.servers]

    @property
    def closed(self) -> bool:
        return self.body.state != "open"

    @property
    def settled(self) -> str | None:
        return self.body.state if self.body.state in ("activated", "abandoned") else None

    def _reserved(self, server: str, headers: bool) -> dict[str, str]:
        for s in self.body.servers:
            if s.server == server and not self.closed:
                return dict(s.headers if headers else s.env)
        return {}

    def stdio_env(self, server: str, base_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Configured values with reserved names dropped, then the reserved values last."""
        reserved = self._reserved(server, headers=False)
        assert set(reserved) <= set(RESERVED_ENV)
        return {**strip_reserved_env(base_env), **reserved}

    def http_headers(self, server: str, base_headers: Mapping[str, str] | None = None) -> dict[str, str]:
        reserved = self._reserved(server, headers=True)
        assert set(reserved) <= set(RESERVED_HEADERS)
        return {**strip_reserved_headers(base_headers), **reserved}

    async def _post(self, template: str, **kw: Any) -> RunBody:
        path = paths.url(template, run_id=self.run_id)
        self.body = await self._client.call("POST", path, RunBody, **kw)
        return self.body

    async def refresh(self) -> RunBody:
        self.body = (await self._client.get_run(self.run_id)).body
        return self.body

    async def heartbeat(self) -> RunBody:
        return await self._post(paths.HOST_HEARTBEAT)

    async def close(self) -> list[str]:
        """Close and drain; the ids of the run's active claims."""
        body = await self._post(paths.HOST_CLOSE)
        return [c.continuation_id for c in body.claims if c.state not in _TERMINAL]

    async def finalize(self, history: Sequence[Mapping[str, Any]]) -> str | None:
        body = await self._post(paths.HOST_FINALIZE, json={"history": [dict(m) for m in history]})
        return body.snapshot_digest

    async def activate(self) -> None:
        await self._post(paths.HOST_ACTIVATE)

    async def abandon(self) -> None:
        await self._post(paths.HOST_ABANDON)

    async def adopt_task(self, server: str, handle: TaskHandle) -> AdoptedTask:
        """Adopt an MCP task handle ``server`` answered with, as the in-process binding does."""
        body = AdoptTaskRequest(
            server=server,
            task_id=handle.task_id,
            status=handle.status,
            poll_interval_ms=handle.poll_interval_ms,
            ttl_ms=handle.ttl_ms,
        )
        path = paths.url(paths.HOST_TASKS, run_id=self.run_id)
        return await self._client.call("POST", path, AdoptedTask, content=_enc.encode(body), headers=_JSON)


_TERMINAL = frozenset({"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"})
