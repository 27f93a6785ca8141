"""Invariants the replay side asserts where they hold (issue 34, point 3): a broken one stops
the work before anything is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from afterword.disk import StateRoot
from afterword.store.catalog import CatalogEntry, CatalogSource
from afterword.store.checkpoint import CheckpointImage, write_checkpoint
from afterword.store.codec import RecordImage
from afterword.store.evidence import Digest
from afterword.store.loading import RECORDS


def _image(records: dict[str, RecordImage], unread: dict[str, CatalogEntry], count: int) -> CheckpointImage:
    return CheckpointImage(
        start_seq=1,
        lsn=3,
        snapshot=dict(records),
        digest=Digest(0, count),
        catalog=CatalogSource(records, unread, {}, {}, {}),
    )


def _root(tmp_path: Path) -> StateRoot:
    root = StateRoot(str(tmp_path / "state"))
    root.ensure_dir(RECORDS)
    return root


@pytest.mark.parametrize(
    ("records", "unread", "count"),
    [
        ({"a": RecordImage("a", 2, b"x")}, {}, 2),  # the digest counts a record the catalog lacks
        ({"a": RecordImage("a", 2, b"x")}, {"a": CatalogEntry("a", 1, ())}, 2),  # read and unread
        ({"a": RecordImage("b", 2, b"x")}, {}, 1),  # a record under another key's name
    ],
)
def test_a_checkpoint_whose_image_disagrees_with_itself_writes_nothing(
    tmp_path: Path, records: dict[str, RecordImage], unread: dict[str, CatalogEntry], count: int
) -> None:
    root = _root(tmp_path)
    manifests: Any = None  # never reached
    with pytest.raises(AssertionError):
        write_checkpoint(root, manifests, _image(records, unread, count), threads=1)
    assert os.listdir(root.path(RECORDS)) == []
