"""A failing watcher never hides a durable commit or stops the other watchers."""

from __future__ import annotations

import logging

import pytest

from afterword.store import Put, Record, RecordStore


def test_failing_watcher_does_not_break_apply(state_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(key: str, old: Record | None, new: Record | None) -> None:
        raise RuntimeError("index bug")

    def good(key: str, old: Record | None, new: Record | None) -> None:
        seen.append(key)

    with RecordStore.open(state_dir) as store:
        store.watch("a/", broken)
        store.watch("a/", good)
        with caplog.at_level(logging.ERROR, logger="afterword.store"):
            store.transact_sync([Put("a/1", b"x"), Put("a/2", b"y")])
        assert store.get("a/1") is not None and store.get("a/2") is not None
        assert seen == ["a/1", "a/2"]
        assert "store watcher" in caplog.text
    with RecordStore.open(state_dir) as store:
        assert store.get("a/2") is not None and store.get("a/2").value == b"y"  # type: ignore[union-attr]


def test_temporaries_are_cleanup_only(state_dir: str) -> None:
    """A leftover temporary of an interrupted atomic write is deleted at open, never loaded."""
    import os

    from afterword.store.codec import RecordImage, encode_record, record_file_name

    with RecordStore.open(state_dir) as store:
        store.transact_sync([Put("a/1", b"x")])
        store.checkpoint_sync()
    stray = os.path.join(state_dir, "records", "." + record_file_name("a/2") + ".tmp-1-1")
    fd = os.open(stray, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, encode_record(RecordImage("a/2", 99, b"half-written")))
    os.close(fd)
    with RecordStore.open(state_dir) as store:
        assert store.get("a/2") is None and store.get("a/1") is not None
    assert not os.path.exists(stray)
