"""Outcomes a channel adapter or synthesizer reports, named by what the caller may do next."""

from __future__ import annotations

from ..errors import AfterwordError, RemoteError


class WorkerError(AfterwordError):
    """Base of worker-layer errors."""


class RetryableDeliveryError(WorkerError, RemoteError):
    """Nothing was posted and trying again later may succeed (5xx, 429, connection refused)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None) -> None:
        self.code = code
        self.retry_after_s = retry_after_s
        super().__init__(message)


class PermanentDeliveryError(WorkerError, RemoteError):
    """The channel refused this delivery for good (unknown channel, revoked access)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class UnconfirmedDeliveryError(WorkerError, RemoteError):
    """The channel may have posted but did not confirm it: the outcome is unknown, never retried."""

    def __init__(self, message: str, code: str = "delivery_error") -> None:
        self.code = code
        super().__init__(message)


class SynthesisError(WorkerError, RemoteError):
    """The model call failed; its outcome is treated as ambiguous (never repeated)."""
