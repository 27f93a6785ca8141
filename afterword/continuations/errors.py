"""Errors of the continuation core. Each carries the HTTP status and code it maps to.

Internally the precise error is raised; the HTTP edge converts it once into the JSON envelope
``{"error": {"code": ..., "message": ...}}``. Messages never contain tokens or payloads.
"""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class ContinuationError(AfterwordError):
    """Base of every error of the continuation core."""

    status = 500
    code = "internal"


class InvalidRequest(ContinuationError, CallerError):
    """The caller sent something malformed or outside the rules (the caller's fault)."""

    status = 400
    code = "invalid_request"


class Unauthorized(ContinuationError, CallerError):
    """No valid credential for this operation."""

    status = 401
    code = "unauthorized"


class Forbidden(ContinuationError, CallerError):
    """The credential is valid but does not grant this operation or destination."""

    status = 403
    code = "forbidden"


class NotFound(ContinuationError, CallerError):
    status = 404
    code = "not_found"


class Conflict(ContinuationError, CallerError):
    """The request contradicts what was already accepted (identity reused, state refuses)."""

    status = 409
    code = "conflict"


class Closed(ContinuationError, CallerError):
    """The capability or continuation no longer accepts this (closed, expired, terminal)."""

    status = 410
    code = "closed"


class Compacted(ContinuationError, CallerError):
    """An operator verb named a record that retention has compacted into a tombstone: its
    payload and answer are gone, so nothing can be retried, cancelled or resolved any more.
    Distinct from ``not_found``: ``show`` and ``list`` still report its outcome."""

    status = 410
    code = "compacted"

    def __init__(self, cid: str, state: str, verb: str) -> None:
        super().__init__(
            f"continuation {cid} was compacted by retention after it ended {state}: its payload and "
            f"answer are gone, so it cannot be {verb}; `show` still reports its outcome and receipt"
        )


class ServiceDisabled(Closed):
    """The configuration sets ``continuations.enabled: false``: no surface admits claims.

    ``open_service`` raises it before opening anything; a service built directly refuses
    every claim and ``begin_run`` with it (HTTP 410 ``closed``).
    """

    def __init__(self) -> None:
        super().__init__("continuations are disabled in this configuration (continuations.enabled is false)")


class RequestTooLarge(ContinuationError, CallerError):
    """A request body or result exceeds its documented bound (HTTP 413 ``too_large``)."""

    status = 413
    code = "too_large"


class AdmissionLimit(ContinuationError, CallerError):
    """Too many active continuations globally or for one origin."""

    status = 429
    code = "admission_limit"


class InvalidTransition(Conflict):
    """A lifecycle does not allow this event in the record's current state; nothing changed.

    The one class for both lifecycles: the continuation lifecycle raises it with the record's
    state, the task journal (:mod:`afterword.tasks`) with ``subject="task <id>"`` as well.
    """

    def __init__(self, state: str, event: str, *, subject: str | None = None) -> None:
        self.state = state
        self.event = event
        self.subject = subject
        message = f"{event} is not allowed in state {state}"
        super().__init__(f"{subject}: {message}" if subject else message)


class SnapshotError(ContinuationError, CallerError):
    """The origin history cannot form a valid snapshot (the host's fault)."""

    status = 400
    code = "invalid_request"


class RunClosed(Closed):
    """The run is closed (its turn ended) but not settled yet: nothing new may join it, as a
    claim after ``close`` is refused (HTTP 409 ``closed``; a settled run answers 410)."""

    status = 409


class Unavailable(ContinuationError, StateError):
    """This service lacks what the request needs, through no fault of the caller's: e.g.
    following an MCP task without the MCP SDK installed (HTTP 503 ``unavailable``)."""

    status = 503
    code = "unavailable"
