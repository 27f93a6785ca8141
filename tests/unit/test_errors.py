"""afterword.errors: one root for every exception class, each leaf named by whose fault it is."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import afterword
from afterword.errors import AfterwordError, CallerError, RemoteError, StateError


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(afterword.__path__, "afterword."):
        if info.name == "afterword.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_exception_class_in_the_package_derives_from_afterword_error() -> None:
    found = _defined_exceptions()
    # The walk must really see the package: there are dozens of error classes across layers.
    assert len(found) > 60
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, AfterwordError))
    assert outside == []


def test_no_exception_class_hides_inside_a_function_or_class() -> None:
    # The walk above sees module-level classes only; a nested exception class would escape it.
    root = Path(afterword.__file__).parent
    nested: list[str] = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top:
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    nested.append(f"{path.name}:{node.name}")
    assert nested == []


# Written out by hand, from each class's documented meaning, not read from the code.
FAULT = {
    CallerError: [
        "afterword.continuations.errors.InvalidRequest",
        "afterword.continuations.errors.Unauthorized",
        "afterword.continuations.errors.Forbidden",
        "afterword.continuations.errors.NotFound",
        "afterword.continuations.errors.Conflict",
        "afterword.continuations.errors.InvalidTransition",
        "afterword.continuations.errors.Closed",
        "afterword.continuations.errors.ServiceDisabled",
        "afterword.continuations.errors.RequestTooLarge",
        "afterword.continuations.errors.AdmissionLimit",
        "afterword.continuations.errors.SnapshotError",
        "afterword.wal.errors.TransactionTooLarge",
        "afterword.wal.errors.WalClosedError",
        "afterword.store.errors.StoreClosedError",
        "afterword.store.errors.RecordTooLarge",
        "afterword.store.errors.InvalidKeyError",
        "afterword.store.errors.VersionConflict",
        "afterword.blobs.errors.BlobQuotaExceeded",
        "afterword.blobs.errors.BlobTooLarge",
        "afterword.history.errors.InvalidMessageError",
        "afterword.history.errors.MessageTooLarge",
        "afterword.tasks.errors.InvalidTransition",
        "afterword.tasks.errors.UnknownTaskError",
        "afterword.tasks.errors.SupervisorError",
        "afterword.config.model.ConfigError",
        "afterword.clients.mcp_sessions.McpHostError",
        "afterword.clients.producer.NoCapability",
        "afterword.clients.producer.InvalidCapability",
        "afterword.clients.producer.RejectedByService",
    ],
    StateError: [
        "afterword.wal.errors.WalCorruptError",
        "afterword.store.errors.StoreLockedError",
        "afterword.store.errors.StoreCorruptError",
        "afterword.app.repository.IndexCorrupt",
        "afterword.disk.errors.UnsafeStateError",
        "afterword.disk.errors.DurabilityError",
        "afterword.disk.errors.DiskFailedError",
        "afterword.blobs.errors.BlobCorruptError",
        "afterword.blobs.errors.BlobMissingError",
        "afterword.blobs.errors.BlobBindingError",
        "afterword.history.errors.HistoryCorruptError",
        "afterword.tasks.errors.TaskJournalCorrupt",
        "afterword.legacy.formats.MigrationError",
        "afterword.cli.tasks.JournalUnavailable",
        "afterword.clients.mcp_sdk.McpSdkUnavailable",
        "afterword.worker.loop.BindingInvalid",
        "afterword.worker.loop.Fallback",
    ],
    RemoteError: [
        "afterword.worker.errors.RetryableDeliveryError",
        "afterword.worker.errors.PermanentDeliveryError",
        "afterword.worker.errors.UnconfirmedDeliveryError",
        "afterword.worker.errors.SynthesisError",
        "afterword.clients.producer.ServiceUnavailable",
        "afterword.clients.mcp_sdk.TaskUnknown",
        "afterword.clients.mcp_sdk.TaskChannelClosed",
        "afterword.clients.mcp_task_wire.MalformedTask",
    ],
}


@pytest.mark.parametrize(
    ("qualname", "category"),
    [(name, cat) for cat, names in FAULT.items() for name in names],
)
def test_each_leaf_names_whose_fault_it_is(qualname: str, category: type[AfterwordError]) -> None:
    module, _, name = qualname.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, category)
    others = {CallerError, StateError, RemoteError} - {category}
    assert not any(issubclass(cls, other) for other in others)


def test_existing_catch_sites_keep_working() -> None:
    from afterword.blobs import BlobError, BlobTooLarge
    from afterword.continuations.errors import ContinuationError, InvalidRequest
    from afterword.disk import DiskError, DurabilityError
    from afterword.history import HistoryError, InvalidMessageError
    from afterword.store import RecordTooLarge, StoreCorruptError, StoreError
    from afterword.tasks import TaskError, UnknownTaskError
    from afterword.wal import TransactionTooLarge, WalError
    from afterword.worker.errors import RetryableDeliveryError, WorkerError

    # Each package base still catches its own leaves ...
    for base, error in [
        (BlobError, BlobTooLarge("x")),
        (ContinuationError, InvalidRequest("x")),
        (DiskError, DurabilityError("p", "fsync", 5)),
        (HistoryError, InvalidMessageError("x")),
        (StoreError, RecordTooLarge("x")),
        (TaskError, UnknownTaskError("t1")),
        (WalError, TransactionTooLarge("x")),
        (WorkerError, RetryableDeliveryError("c", "x")),
    ]:
        with pytest.raises(base):
            raise error
    # ... the builtin bases some of them always had still catch them ...
    with pytest.raises(ValueError):
        raise InvalidMessageError("bad")
    with pytest.raises(KeyError):
        raise UnknownTaskError("t1")
    assert str(UnknownTaskError("t1")) == "no task 't1'"
    # ... and the new root catches all of them, with the HTTP mapping unchanged.
    with pytest.raises(AfterwordError):
        raise StoreCorruptError("damaged")
    assert (InvalidRequest.status, InvalidRequest.code) == (400, "invalid_request")


def test_the_root_is_exported_and_imports_nothing_of_afterword() -> None:
    assert afterword.AfterwordError is AfterwordError
    assert "AfterwordError" in afterword.__all__
    source = Path(afterword.__file__).parent.joinpath("errors.py").read_text(encoding="utf-8")
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in imports] == ["__future__"]


def test_one_invalid_transition_class_serves_both_lifecycles() -> None:
    from afterword.continuations import InvalidTransition
    from afterword.continuations.errors import Conflict
    from afterword.tasks import InvalidTransition as TaskInvalidTransition
    from afterword.tasks import core
    from afterword.tasks.records import TaskRecord

    assert TaskInvalidTransition is InvalidTransition
    ended = TaskRecord(
        task_id="t1",
        session_id="s",
        tool_call_id="c",
        command=("true",),
        cwd=None,
        notify="on_exit",
        created_at=0.0,
        output_path="o",
        state="exited",
    )
    with pytest.raises(InvalidTransition) as info:
        core.adopted(ended)
    assert isinstance(info.value, Conflict)
    assert (info.value.state, info.value.event, info.value.subject) == ("exited", "adopted", "task t1")
    assert str(info.value) == "task t1: adopted is not allowed in state exited"


def test_every_too_large_error_follows_one_name_pattern_and_is_the_callers_fault() -> None:
    found = _defined_exceptions()
    too_large = {cls for cls in found.values() if "large" in cls.__name__.lower()}
    assert len(too_large) >= 5  # wal, store, blobs, history, continuations (and the producer)
    for cls in too_large:
        assert cls.__name__.endswith("TooLarge"), cls.__name__
        assert issubclass(cls, CallerError), cls.__name__


def test_old_too_large_names_are_the_same_classes() -> None:
    from afterword.history import MessageTooLarge, MessageTooLargeError

    assert MessageTooLargeError is MessageTooLarge
