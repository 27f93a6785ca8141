"""Workloads: the plugin interface of the simulator (the built-in ones are in ``store_workloads``).

A workload is a small class with four duties (see :class:`Workload`):

* ``run`` drives the real system on the disk it is given, numbering its logical operations
  ``1..ops`` and reporting each to the :class:`Journal` (begun, acknowledged, failed);
* ``expect`` says what a correct system holds after a given sequence of operations took effect;
* ``recover`` runs the real recovery on a state directory and returns what it holds;
* optional ``file_problems``/``state_problems``/``probe`` add checks of its own.

The simulator knows nothing else about the system under test, so another service built on
the durability layer brings its own workload (``--workload package.module:Class``) without
touching the runner. Workloads must be deterministic for a given ``seed`` and ``ops``: the
same calls in the same order, so a crash state id found once names the same state again.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import ClassVar, TypeVar

from afterword.disk import Disk, DiskFailedError
from afterword.store import StoreClosedError

T = TypeVar("T")
Observation = Mapping[str, Hashable]
"""What recovery exposes, as comparable values (for the record store: key -> (lsn, value, blobs))."""


class WorkloadError(Exception):
    """The workload itself misbehaved (nondeterminism, an unexpected failure while recording)."""


# -- the journal ------------------------------------------------------------------------------
ACKED, REFUSED, UNKNOWN = "acked", "refused", "unknown"


class Journal:
    """Where a workload reports its operations; each report becomes a mark in the log.

    ``tolerant`` is set during I/O-error injection: a failing operation is then recorded and
    the workload goes on with the next one (the system must refuse or survive it), instead of
    the failure aborting the recording.
    """

    def __init__(self, mark: Callable[[str, int, str], None], *, tolerant: bool = False) -> None:
        self._mark = mark
        self.tolerant = tolerant
        self.outcomes: dict[int, str] = {}
        self.errors: dict[int, str] = {}

    def begin(self, op: int) -> None:
        self._mark("begin", op, "")

    def ack(self, op: int, note: str = "") -> None:
        self.outcomes[op] = ACKED
        self._mark("ack", op, note)

    def fail(self, op: int, exc: BaseException | None, *, refused: bool) -> None:
        """``refused``: the system turned the operation away before it could take effect."""
        self.outcomes[op] = REFUSED if refused else UNKNOWN
        self.errors[op] = "" if exc is None else f"{type(exc).__name__}: {exc}"
        self._mark("fail", op, self.errors[op])

    def note(self, text: str) -> None:
        self._mark("note", 0, text)

    def fact(self, name: str, value: str) -> None:
        """Declare that ``Workload.facts`` must report ``name`` as ``value`` after any crash
        from now on (call it once the fact is durable)."""
        self._mark("fact", 0, f"{name}={value}")

    def attempt(self, op: int, fn: Callable[[], T], *, poisoned: Callable[[], bool]) -> T | None:
        """Run operation ``op``; ``poisoned()`` tells whether the system already refuses writes."""
        was_poisoned = poisoned()
        self.begin(op)
        try:
            result = fn()
        except Exception as exc:
            if not self.tolerant:
                raise
            self.fail(op, exc, refused=was_poisoned and isinstance(exc, DiskFailedError | StoreClosedError))
            return None
        self.ack(op)
        return result

    async def attempt_async(
        self, op: int, fn: Callable[[], Awaitable[T]], *, poisoned: Callable[[], bool]
    ) -> T | None:
        was_poisoned = poisoned()
        self.begin(op)
        try:
            result = await fn()
        except Exception as exc:
            if not self.tolerant:
                raise
            self.fail(op, exc, refused=was_poisoned and isinstance(exc, DiskFailedError | StoreClosedError))
            return None
        self.ack(op)
        return result

    def side(self, what: str, fn: Callable[[], T]) -> T | None:
        """A step that is not a logical operation (checkpoint, sweep): failures are noted."""
        try:
            return fn()
        except Exception as exc:
            if not self.tolerant:
                raise
            self.note(f"{what} failed: {type(exc).__name__}: {exc}")
            return None


# -- the plugin interface ---------------------------------------------------------------------
class Workload(abc.ABC):
    """One deterministic scenario for the crash simulator (subclass and register it).

    Args:
        seed: drives every random choice the workload makes (keys, values, sizes).
        ops: how many logical operations to perform (``default_ops`` when None).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    default_ops: ClassVar[int] = 8
    state_subdir: ClassVar[str] = "state"  # the state directory, relative to the recorded base

    def __init__(self, *, seed: int, ops: int | None = None) -> None:
        self.seed = seed
        self.ops = self.default_ops if ops is None else ops
        if self.ops < 1:
            raise ValueError("a workload needs at least one operation")

    @abc.abstractmethod
    def run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        """Perform operations ``1..ops`` on ``state_dir`` through ``disk``.

        Call ``journal.begin(i)`` before operation ``i`` may touch the disk and
        ``journal.ack(i)`` once the system acknowledged it (``Journal.attempt`` does both).
        Operations must take effect in number order (the checkers compare against prefixes).
        """

    @abc.abstractmethod
    def expect(self, committed: Sequence[int]) -> Observation:
        """What recovery must expose when exactly ``committed`` (in order) took effect."""

    @abc.abstractmethod
    def recover(self, state_dir: str, disk: Disk) -> Observation:
        """Open ``state_dir`` with the real recovery, observe it, close it; raise if it fails."""

    @classmethod
    def ref(cls) -> str:
        """How ``--workload`` names this class in a new process: its registered name, or
        ``module:Class`` for a workload that lives outside the simulator."""
        return cls.name if WORKLOADS.get(cls.name) is cls else f"{cls.__module__}:{cls.__qualname__}"

    def file_problems(self, files: Mapping[str, bytes], histories: Sequence[Sequence[int]]) -> list[str]:
        """Checks on the raw files of a crash state, before recovery (paths relative to the
        state directory). ``histories`` are the operation sequences that may have happened."""
        return []

    def state_problems(self, state_dir: str, observation: Observation) -> list[str]:
        """Checks on a recovered (and closed) state directory."""
        return []

    def facts(self, state_dir: str) -> Mapping[str, str]:
        """Durable facts of a recovered state directory, compared with ``Journal.fact``
        declarations (for the record store: which token secret it holds)."""
        return {}

    def probe(self, state_dir: str, observation: Observation) -> list[str]:
        """Recover ``state_dir`` (the crash state, not yet recovered) and keep using it in the
        same session, reporting anything that goes wrong. ``observation`` is what recovery
        exposed on an identical copy."""
        return []


WORKLOADS: dict[str, type[Workload]] = {}
W = TypeVar("W", bound=type[Workload])


def register(cls: W) -> W:
    WORKLOADS[cls.name] = cls
    return cls


def get_workload(name: str) -> type[Workload]:
    """A registered workload, or ``package.module:Class`` imported on demand."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:  # a typo in --workload, not a crash finding
            raise ValueError(f"cannot load workload {name}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Workload)):
            raise ValueError(f"{name} is not a crashsim Workload subclass")
        return cls
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)} or module:Class")
