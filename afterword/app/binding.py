"""Run bindings: the host's side of request-bound continuation claims.

A run gets one claim capability per selected continuation server. The capability is bound
to the run, the server, the exact origin conversation bucket, the physical reply route and
the delivery mode; it travels to the server only through reserved environment variables
(stdio) or reserved headers (HTTP) that the host writes last, over any configured values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from ..continuations.errors import Closed, InvalidRequest, RunClosed
from ..continuations.model import Mode
from ..protocol.headers import RESERVED_ENV as RESERVED_ENV
from ..protocol.headers import RESERVED_HEADERS as RESERVED_HEADERS
from ..protocol.headers import strip_reserved_env, strip_reserved_headers
from ..protocol.tasks import AdoptedTask, TaskHandle

__all__ = [
    "RESERVED_ENV",
    "RESERVED_HEADERS",
    "CapabilityRegistry",
    "Finalized",
    "IssuedCapability",
    "RunBinding",
    "RunClaims",
    "RunSettler",
    "TaskAdopter",
]


@dataclass
class IssuedCapability:
    """One server's claim authority for one run, as the service issued it. ``token`` is never
    logged. (What the tool server holds is :class:`afterword.producer.ClaimCapability`.)"""

    capability_id: str
    run_id: str
    server_name: str
    conversation_id: str
    reply_to: str | None
    mode: Mode
    fingerprint: str
    token: str = field(repr=False)
    expires_at_ms: int
    closed: bool = False
    admitting: int = 0
    claim_ids: list[str] = field(default_factory=list)
    drained: anyio.Event = field(default_factory=anyio.Event)

    def enter(self) -> None:
        self.admitting += 1

    def leave(self) -> None:
        self.admitting -= 1
        if self.admitting == 0 and self.closed:
            self.drained.set()


class CapabilityRegistry:
    """The claim capabilities issued and not yet expired, by capability id.

    Every capability lives the same fixed time from its issue, so insertion order is expiry
    order and forgetting the expired ones only looks at the oldest: cheap enough to run at
    every issue, which keeps a host that never closes its runs from growing this forever.
    """

    def __init__(self) -> None:
        self._caps: dict[str, IssuedCapability] = {}

    def __len__(self) -> int:
        return len(self._caps)

    def add(self, cap: IssuedCapability) -> None:
        self._caps[cap.capability_id] = cap

    def get(self, capability_id: str) -> IssuedCapability | None:
        return self._caps.get(capability_id)

    def forget_expired(self, now_ms: int) -> None:
        """Closed capabilities stay until they expire, to answer lost-response repeats."""
        while self._caps:
            cap_id, cap = next(iter(self._caps.items()))
            if cap.expires_at_ms >= now_ms:
                # A clock stepped back may leave a later expiry in front; what it hides
                # expires at the latest one lifetime after this one.
                return
            del self._caps[cap_id]


@dataclass(frozen=True)
class RunClaims:
    """What settling a run needs: the run, and the claims its capabilities admitted."""

    run_id: str
    conversation_id: str
    claim_ids: tuple[str, ...]
    history_boundary: int = 0  # from the origin snapshot, once finalize has built one


@dataclass(frozen=True)
class Finalized:
    digest: str
    history_boundary: int


class RunSettler(Protocol):
    """What a binding asks of the app (``afterword.app.runs.Runs`` implements it)."""

    @property
    def claim_url(self) -> str: ...

    def forget_expired(self) -> None: ...

    def active_claims(self, run: RunClaims) -> list[str]: ...

    async def finalize_run(
        self, run: RunClaims, history: Sequence[Mapping[str, Any]]
    ) -> Finalized | None: ...

    async def activate_run(self, run: RunClaims) -> None: ...

    async def abandon_run(self, run: RunClaims) -> None: ...


class TaskAdopter(Protocol):
    """Adopts an MCP task handle under one server's capability (``afterword.app.tasks.Tasks``)."""

    async def adopt(self, cap: IssuedCapability, handle: TaskHandle) -> AdoptedTask: ...


class RunBinding:
    """The host's handle on one agent run's continuation authority (docs/design.md, Contracts: app handle)."""

    def __init__(
        self,
        settler: RunSettler,
        run_id: str,
        conversation_id: str,
        reply_to: str | None,
        mode: str,
        capabilities: dict[str, IssuedCapability],
        tasks: TaskAdopter | None = None,
    ) -> None:
        self._settler = settler
        self._tasks = tasks
        self.run_id = run_id
        self.conversation_id = conversation_id
        self.reply_to = reply_to
        self.mode = mode
        self._caps = capabilities
        self.closed = False
        self.settled: str | None = None  # "activated" | "abandoned"
        self.history_boundary = 0

    def __repr__(self) -> str:
        return f"<RunBinding run={self.run_id!r} servers={sorted(self._caps)} closed={self.closed}>"

    @property
    def servers(self) -> Sequence[str]:
        return sorted(self._caps)

    @property
    def claim_ids(self) -> list[str]:
        """Every claim admitted under this run (active or finished), in admission order."""
        return [cid for cap in self._caps.values() for cid in cap.claim_ids]

    def _claims(self) -> RunClaims:
        return RunClaims(self.run_id, self.conversation_id, tuple(self.claim_ids), self.history_boundary)

    def _reserved(self, server: str, names: tuple[str, ...]) -> dict[str, str]:
        """The reserved values for ``server`` under ``names`` (empty: no authority)."""
        cap = self._caps.get(server)
        if cap is None or self.closed:
            return {}
        values = (self._settler.claim_url, cap.token, cap.fingerprint, cap.mode)
        return dict(zip(names, values, strict=True))

    def stdio_env(self, server: str, base_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a stdio server: configured values with reserved names are dropped,
        then the reserved values are written last (only for a selected server)."""
        return {**strip_reserved_env(base_env), **self._reserved(server, RESERVED_ENV)}

    def http_headers(self, server: str, base_headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """Headers for a loopback HTTP server, built the same way as :meth:`stdio_env`."""
        return {**strip_reserved_headers(base_headers), **self._reserved(server, RESERVED_HEADERS)}

    async def adopt_task(self, server: str, handle: TaskHandle) -> AdoptedTask:
        """Adopt an MCP task handle that ``server`` answered a tool call of this run with, as a
        task-backed continuation bound exactly like a claim of that server (docs/tasks-bridge.md).
        Idempotent per (run, server, task id); refused once the run is closed."""
        cap = self._caps.get(server)
        if cap is None:
            raise InvalidRequest(f"server {server!r} is not selected for continuations in this run")
        if self._tasks is None:
            raise InvalidRequest("this binding cannot adopt MCP tasks")
        try:
            return await self._tasks.adopt(cap, handle)
        except RunClosed:
            if self.settled is None:
                raise
            # Settled is final (410, as the host API answers), not merely closed (409).
            raise Closed(f"run {self.run_id} is already {self.settled}: a task cannot join it") from None

    async def close(self) -> list[str]:
        """Close every capability to new claims, wait for admitted claims to finish committing,
        and return the ids of this run's active claims."""
        self.closed = True
        for cap in self._caps.values():
            cap.closed = True
            if cap.admitting == 0:
                cap.drained.set()
        for cap in self._caps.values():
            await cap.drained.wait()
        self._settler.forget_expired()
        return self._settler.active_claims(self._claims())

    async def finalize(self, history: Sequence[Mapping[str, Any]]) -> str | None:
        """Build and bind the origin snapshot for every active claim; returns its digest, or
        None when no claim needs origin context. Raises when it cannot be secured, so the
        host fails its turn instead of publishing success."""
        if not self.closed:
            await self.close()
        done = await self._settler.finalize_run(self._claims(), history)
        if done is None:
            return None
        self.history_boundary = done.history_boundary
        return done.digest

    async def activate(self) -> None:
        """The origin turn committed: publish the group activation marker."""
        if not self.closed:
            await self.close()
        await self._settler.activate_run(self._claims())
        self.settled = "activated"

    async def abandon(self) -> None:
        """The origin run failed or was cancelled before commit."""
        if not self.closed:
            await self.close()
        await self._settler.abandon_run(self._claims())
        self.settled = "abandoned"
