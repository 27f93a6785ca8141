"""The one root of every error afterword raises, and the three ways an error can be nobody's bug.

Every exception class defined in the package derives from :class:`AfterwordError`, so a caller
embedding afterword can catch "anything afterword refused" in one place. Each package keeps its
own base (``StoreError``, ``WalError``, ``ContinuationError``, ...) for callers that care which
layer spoke; each leaf also names whose fault it is by deriving from one category:

* :class:`CallerError` - the caller asked for something the rules forbid (malformed input, no
  credential, unknown id, a stale expectation, too large, over a limit, used after close).
  Repeating the same call unchanged will fail the same way.
* :class:`StateError` - the state directory (or something else outside the caller's request)
  cannot be trusted or used: damaged records, unsafe files, a failed fsync, another owner's
  lock. Fail closed; an operator has to look.
* :class:`RemoteError` - a party outside this process failed or did not answer: a delivery
  channel, the model provider, or the service as seen from a client. Whether a retry helps is
  said by the subclass.

A bug in afterword is not given a class here on purpose: it surfaces as an ordinary Python
exception (``AssertionError``, ``RuntimeError`` for API misuse) and the HTTP edge maps anything
that is not an ``AfterwordError`` to a 500 without its text. Classes without a category are
internal signals that never leave their module (``history.durable._Refused``).

This module imports nothing from afterword, so the lowest layer (``afterword.disk``) can use it.
"""

from __future__ import annotations

__all__ = ["AfterwordError", "CallerError", "RemoteError", "StateError"]


class AfterwordError(Exception):
    """Base of every exception class defined in ``afterword``."""


class CallerError(AfterwordError):
    """The caller's request breaks a rule; the same request will be refused again."""


class StateError(AfterwordError):
    """Stored state or the environment it lives in cannot be trusted or used (fail closed)."""


class RemoteError(AfterwordError):
    """Something outside this process failed or did not answer."""
