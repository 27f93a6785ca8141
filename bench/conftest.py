"""Fixtures of the pytest-benchmark suites (``python -m pytest bench``).

Every suite uses pedantic mode with ``iterations=1`` and builds fresh files in its setup, so
no round inherits a grown log or a warm file from the one before. Under
``--benchmark-disable`` (the CI smoke run, which only proves the benchmarks still execute)
each target runs once and data sets shrink to a size that runs in seconds; see :func:`size`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.common import Closable, Fresh, Size, scratch_base, scratch_dir


@pytest.fixture(scope="session")
def smoke(pytestconfig: pytest.Config) -> bool:
    """True when benchmarks are disabled: figures are not recorded, only execution is checked."""
    return bool(pytestconfig.getoption("benchmark_disable"))


@pytest.fixture(scope="session")
def size(smoke: bool) -> Size:
    """``size(real, smoke_size)``: the data-set size to use in this session."""

    def pick(real: int, smoke_size: int) -> int:
        return smoke_size if smoke else real

    return pick


@pytest.fixture(scope="session")
def scratch_root() -> Iterator[str]:
    """A session directory on the repository's file system, removed at the end."""
    with scratch_dir(
        scratch_base(os.environ.get("AFTERWORD_BENCH_DIR")), prefix="afterword-pytest-bench-"
    ) as d:
        yield d


@pytest.fixture
def fresh(scratch_root: str) -> Iterator[Fresh]:
    """A factory of fresh owner-only directories for one test (one per benchmark round)."""
    made: list[str] = []
    with scratch_dir(scratch_root, prefix="test-") as test_dir:

        def make() -> str:
            path = os.path.join(test_dir, f"r{len(made):04d}")
            os.mkdir(path, 0o700)
            made.append(path)
            return path

        yield make


@pytest.fixture
def closing() -> Iterator[list[Closable]]:
    """Objects a benchmark's rounds opened; all closed when the test ends.

    pytest-benchmark skips ``teardown`` when benchmarks are disabled, so rounds register what
    they open here instead.
    """
    opened: list[Closable] = []
    try:
        yield opened
    finally:
        for item in reversed(opened):
            item.close()
