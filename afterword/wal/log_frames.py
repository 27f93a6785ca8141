"""The frames a replay hands over, left where they lie in the segment images.

A 64 MiB log holds tens of thousands of frames. Copying each payload into its own ``bytes``
and wrapping it in a ``Frame`` tuple cost about a fifth of a whole store open (the copies,
their page faults, the objects, and freeing them all when the open returns). ``LogFrames``
instead keeps the segment images the scan read anyway, plus one flat array of payload spans
(start, end) into them; lsns are contiguous, so frame ``i`` has lsn ``first_lsn + i``.

Readers that want speed take :meth:`LogFrames.by_run` (a memoryview of each buffer and its
spans) or :meth:`LogFrames.payload`; everything else can use it as a sequence of ``Frame``,
built on demand (a copy of the payload each time).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, overload

from .layout import FRAME_HEADER_SIZE, Frame, encode_frame, frame_size

_SPAN = "q"  # native int64: spans are only ever read back by this process


class Run(NamedTuple):
    """Frames that lie in one buffer, from frame index ``first`` until the next run."""

    first: int
    data: bytes  # a segment image, or the copy inside a shadow
    shift: int  # segment offset of ``data[0]`` (0 for a segment image)


class LogFrames(Sequence[Frame]):
    """Frames in lsn order, from ``first_lsn`` on, as payload spans into a few buffers."""

    __slots__ = ("first_lsn", "runs", "spans")

    def __init__(self, first_lsn: int) -> None:
        self.first_lsn = first_lsn
        self.spans: array[int] = array(_SPAN)  # start0, end0, start1, end1, ...
        self.runs: list[Run] = []

    @classmethod
    def from_frames(cls, frames: Iterable[Frame]) -> LogFrames:
        """``frames`` (contiguous lsns) gathered into one buffer of frames; offsets and ends
        are then those of that buffer."""
        items = list(frames)
        out = cls(items[0].lsn if items else 0)
        parts: list[bytes] = []
        pos = 0
        for i, f in enumerate(items):
            if f.lsn != out.first_lsn + i:
                raise ValueError(f"frame lsns must be contiguous: {f.lsn} at index {i}")
            parts.append(encode_frame(0, f.lsn, f.batch_start, f.payload))
            out.spans.extend((pos + FRAME_HEADER_SIZE, pos + FRAME_HEADER_SIZE + len(f.payload)))
            pos += len(parts[-1])
        out.runs.append(Run(0, b"".join(parts), 0))
        return out

    def start_run(self, data: bytes, shift: int = 0) -> None:
        """Frames appended to :attr:`spans` from now on lie in ``data``."""
        if self.runs and self.runs[-1].first == len(self):
            self.runs.pop()  # the previous run got no frame
        self.runs.append(Run(len(self), data, shift))

    def __len__(self) -> int:
        return len(self.spans) >> 1

    def _run_at(self, index: int) -> Run:
        return self.runs[bisect_right(self.runs, index, key=lambda run: run.first) - 1]

    def payload(self, index: int) -> memoryview:
        """Frame ``index``'s payload, a view into its buffer (no copy)."""
        return memoryview(self._run_at(index).data)[self.spans[2 * index] : self.spans[2 * index + 1]]

    def by_run(self) -> Iterator[tuple[memoryview, memoryview]]:
        """For each run: a view of its buffer, and its spans (start, end, start, ...)."""
        flat = memoryview(self.spans)
        for i, run in enumerate(self.runs):
            stop = self.runs[i + 1].first if i + 1 < len(self.runs) else len(self)
            yield memoryview(run.data), flat[2 * run.first : 2 * stop]

    def owners(self) -> list[memoryview]:
        """A view of the buffer holding each frame, by index (for many random reads)."""
        out: list[memoryview] = []
        for i, run in enumerate(self.runs):
            stop = self.runs[i + 1].first if i + 1 < len(self.runs) else len(self)
            out += [memoryview(run.data)] * (stop - run.first)
        return out

    def payloads(self) -> Iterator[tuple[int, memoryview]]:
        """``(lsn, payload view)`` of every frame, in order."""
        lsn = self.first_lsn
        for view, spans in self.by_run():
            it = iter(spans)
            for start, end in zip(it, it, strict=True):
                yield lsn, view[start:end]
                lsn += 1

    def checksum(self, index: int) -> int:
        """The checksum field of frame ``index`` (the 8 bytes before its payload)."""
        start = self.spans[2 * index]
        return int.from_bytes(self._run_at(index).data[start - 8 : start], "little")

    def frame(self, index: int) -> Frame:
        if not 0 <= index < len(self):
            raise IndexError(index)
        run = self._run_at(index)
        start, end = self.spans[2 * index], self.spans[2 * index + 1]
        offset = start - FRAME_HEADER_SIZE
        batch_start = int.from_bytes(run.data[offset + 16 : offset + 24], "little")
        at = offset + run.shift
        return Frame(
            at, self.first_lsn + index, batch_start, bytes(run.data[start:end]), at + frame_size(end - start)
        )

    @overload
    def __getitem__(self, index: int) -> Frame: ...
    @overload
    def __getitem__(self, index: slice) -> list[Frame]: ...
    def __getitem__(self, index: int | slice) -> Frame | list[Frame]:
        if isinstance(index, slice):
            return [self.frame(i) for i in range(*index.indices(len(self)))]
        return self.frame(index + len(self) if index < 0 else index)

    def __iter__(self) -> Iterator[Frame]:
        for i in range(len(self)):
            yield self.frame(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, LogFrames)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<LogFrames lsn {self.first_lsn}..{self.first_lsn + len(self) - 1} in {len(self.runs)} runs>"
