"""Shadow copies of group-commit writes (issue 14, item 5).

The last write of a log has nothing written after it to vouch for it, so without more a
flipped bit in it reads exactly like a torn write and would be cut though the write may have
been acknowledged. Each write therefore carries a self-checking copy of itself behind its
frames. These tests check the two sides of that rule on real segment bytes: damage to a write
that reached the disk whole is restored from its shadow (logged, damaged bytes kept aside),
and a write that never completed is still cut, in every way the crash simulator tears writes.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

import anyio
import pytest

from afterword.disk import StateRoot
from afterword.wal import Frame, WalCorruptError, WalOptions, WriteAheadLog
from afterword.wal.layout import (
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SegmentHeader,
    decode_segment_header,
    encode_frame,
    encode_segment_header,
)
from afterword.wal.scan import SegmentImage, scan_chain
from afterword.wal.shadow import SHADOW_HEADER_SIZE, decode_shadow_at

OPTIONS = WalOptions(segment_size=16 * 1024, max_payload=2048, max_log_bytes=1 << 20, zero_fill=False)
SECTOR = 512


def open_wal(state_dir: str, options: WalOptions = OPTIONS) -> tuple[WriteAheadLog, list[Frame]]:
    return WriteAheadLog.open(StateRoot(state_dir), start_seq=1, checkpoint_lsn=0, options=options)


def payloads_of(state_dir: str, options: WalOptions = OPTIONS) -> list[bytes]:
    wal, frames = open_wal(state_dir, options)
    wal.close()
    return [f.payload for f in frames]


async def _group(wal: WriteAheadLog, payloads: list[bytes]) -> None:
    """One write holding every payload (reserved together, made durable by one leader)."""
    batch = None
    for p in payloads:
        _, batch = wal.reserve(p)
    assert batch is not None
    await wal.wait(batch)


def build(state_dir: str, writes: list[list[bytes]], options: WalOptions = OPTIONS) -> list[bytes]:
    wal, _ = open_wal(state_dir, options)
    for payloads in writes:
        anyio.run(_group, wal, payloads)
    assert wal.stats.batches == len(writes)
    wal.close()
    return [p for w in writes for p in w]


def seg_path(state_dir: str, slot: int = 0) -> Path:
    return Path(state_dir) / "wal" / f"{slot:08d}.seg"


def flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def frames_on_disk(path: Path) -> list[Frame]:
    wal_frames: list[Frame] = []
    data = path.read_bytes()
    header = decode_segment_header(data)
    assert header is not None
    from afterword.wal.layout import decode_frame_at

    offset = SEGMENT_HEADER_SIZE
    while (frame := decode_frame_at(data, offset, header.salt, OPTIONS.max_payload)) is not None:
        wal_frames.append(frame)
        offset = frame.end
    return wal_frames


def brokens(state_dir: str) -> list[str]:
    return sorted(n for n in os.listdir(Path(state_dir) / "wal") if ".broken." in n)


WRITES = [[b"one" * 20], [b"two" * 30, b"three" * 7], [b"four" * 50, b"five" * 9, b"six" * 40]]
LAST = 3  # frames in the last write


@pytest.mark.parametrize("which", range(LAST))
@pytest.mark.parametrize(
    "field",
    [0, 4, 8, 16, 24, FRAME_HEADER_SIZE, -1],
    ids=["marker", "length", "lsn", "batch_start", "checksum", "payload-first", "payload-last"],
)
def test_flipped_bit_in_any_frame_of_the_last_write_is_restored(
    state_dir: str, which: int, field: int, caplog: pytest.LogCaptureFixture
) -> None:
    expected = build(state_dir, WRITES)
    seg = seg_path(state_dir)
    good = seg.read_bytes()
    frame = frames_on_disk(seg)[-LAST + which]
    at = frame.offset + field if field >= 0 else frame.offset + FRAME_HEADER_SIZE + len(frame.payload) - 1
    flip(seg, at, 5)
    damaged = seg.read_bytes()
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        assert payloads_of(state_dir) == expected
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "restored lsn" in messages[0], messages
    assert brokens(state_dir) == ["00000000.broken.0"]
    assert (Path(state_dir) / "wal" / "00000000.broken.0").read_bytes() == damaged
    assert seg.read_bytes() == good  # the primary frames were rewritten exactly
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        wal, _ = open_wal(state_dir)
        wal.append_sync(b"after the repair")
        wal.close()
        assert payloads_of(state_dir) == [*expected, b"after the repair"]
    assert not caplog.records and brokens(state_dir) == ["00000000.broken.0"]


def test_clean_end_with_its_shadow_is_no_repair(state_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    expected = build(state_dir, WRITES)
    frames = frames_on_disk(seg_path(state_dir))
    shadow = decode_shadow_at(seg_path(state_dir).read_bytes(), frames[-1].end, _salt(state_dir))
    assert shadow is not None and (shadow.first_lsn, shadow.last_lsn) == (4, 6)
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        assert payloads_of(state_dir) == expected
        assert payloads_of(state_dir) == expected
    assert not caplog.records and brokens(state_dir) == []


def _salt(state_dir: str, slot: int = 0) -> int:
    header = decode_segment_header(seg_path(state_dir, slot).read_bytes())
    assert header is not None
    return header.salt


def test_every_byte_of_a_damaged_shadow_alone_is_harmless(
    state_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected = build(state_dir, WRITES)
    seg = seg_path(state_dir)
    good = seg.read_bytes()
    end = frames_on_disk(seg)[-1].end
    shadow = decode_shadow_at(good, end, _salt(state_dir))
    assert shadow is not None
    header = decode_segment_header(good)
    assert header is not None
    for at in range(end, end + SHADOW_HEADER_SIZE + len(shadow.copy) + 4):
        data = bytearray(good)
        data[at] ^= 0x10
        plan = scan_chain([SegmentImage(0, bytes(data))], start_seq=1, checkpoint_lsn=0, max_payload=2048)
        assert [f.payload for f in plan.frames] == expected, at
        assert plan.repair is None and plan.restores == [], at
    seg.write_bytes(good[: end + 9] + bytes([good[end + 9] ^ 1]) + good[end + 10 :])
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        assert payloads_of(state_dir) == expected
    assert not caplog.records


def test_bad_frame_before_a_later_write_still_fails_closed(state_dir: str) -> None:
    """The last write's shadow covers only the last write: damage before it is not restorable
    and a later write proves it was acknowledged, so the open refuses (shadow copies are not
    taken for later frames either way)."""
    build(state_dir, WRITES)
    seg = seg_path(state_dir)
    frames = frames_on_disk(seg)
    for victim in (0, 1, 2):
        good = seg.read_bytes()
        flip(seg, frames[victim].offset + FRAME_HEADER_SIZE)
        with pytest.raises(WalCorruptError):
            open_wal(state_dir)
        seg.write_bytes(good)
    assert brokens(state_dir) == []


def test_each_segment_part_of_a_write_has_its_own_shadow(state_dir: str) -> None:
    small = WalOptions(segment_size=2048, max_payload=512, max_log_bytes=1 << 20, zero_fill=False)
    expected = build(state_dir, [[b"a" * 300], [b"b" * 200, b"c" * 200, b"d" * 200, b"e" * 200]], small)
    slots = sorted(int(p.name[:8]) for p in (Path(state_dir) / "wal").glob("*.seg"))
    assert len(slots) == 2  # the second write spans both segments
    for slot in slots:
        path = seg_path(state_dir, slot)
        good = path.read_bytes()
        header = decode_segment_header(good)
        assert header is not None
        from afterword.wal.layout import decode_frame_at

        first = decode_frame_at(good, SEGMENT_HEADER_SIZE, header.salt, 512)
        assert first is not None
        offset, last = SEGMENT_HEADER_SIZE, first
        while (frame := decode_frame_at(good, offset, header.salt, 512)) is not None:
            last, offset = frame, frame.end
        flip(path, last.offset + FRAME_HEADER_SIZE + 3)
        assert payloads_of(state_dir, small) == expected
        assert path.read_bytes() == good


# -- torn writes: a write that never completed is still cut -------------------------------------


def _torn_images(before: bytes, after: bytes, start: int, stop: int) -> list[tuple[str, bytes]]:
    """The crash simulator's torn outcomes of the write ``before -> after`` over
    ``[start, stop)``: every prefix (8-byte steps and each odd byte near the ends), every
    subset of its sectors landed, and each sector alone zero- or garbage-filled."""
    out: list[tuple[str, bytes]] = []
    lengths = set(range(0, stop - start + 1, 8)) | {1, 3, 5, stop - start - 1}
    for n in sorted(lengths):
        out.append((f"prefix {n}", after[: start + n] + before[start + n :]))
    cuts = list(range(start, stop, SECTOR))
    pieces = [
        (p - p % SECTOR if i == 0 else p, min(stop, (p // SECTOR + 1) * SECTOR)) for i, p in enumerate(cuts)
    ]
    pieces = [(max(a, start), b) for a, b in pieces]
    for mask in itertools.product((0, 1), repeat=len(pieces)):
        data = bytearray(before)
        for (a, b), new in zip(pieces, mask, strict=True):
            if new:
                data[a:b] = after[a:b]
        out.append((f"sectors {mask}", bytes(data)))
    for i, (a, b) in enumerate(pieces):
        for fill, name in ((bytes(b - a), "zero"), (os.urandom(b - a), "garbage")):
            data = bytearray(after)
            data[a:b] = fill
            out.append((f"sector {i} {name}", bytes(data)))
    return out


def test_torn_unacknowledged_write_is_cut_or_kept_and_never_refused(state_dir: str) -> None:
    acked = build(state_dir, WRITES)
    seg = seg_path(state_dir)
    before = seg.read_bytes()
    start = frames_on_disk(seg)[-1].end
    batch = [b"seven" * 60, b"eight" * 70, b"nine" * 80]
    wal, _ = open_wal(state_dir)
    anyio.run(_group, wal, batch)
    wal.close()
    after = seg.read_bytes()
    stop = len(after.rstrip(b"\0"))
    assert stop - start > 2 * SECTOR  # the write spans several sectors
    salt = _salt(state_dir)
    for name, image in _torn_images(before, after, start, stop):
        plan = scan_chain([SegmentImage(0, image)], start_seq=1, checkpoint_lsn=0, max_payload=2048)
        got = [f.payload for f in plan.frames]
        # Each frame is its own transaction: an unacknowledged write may keep any prefix.
        assert got[: len(acked)] == acked and got[len(acked) :] == batch[: len(got) - len(acked)], name
        frames_end = start + sum(len(encode_frame(salt, 1, 1, p)) for p in batch)
        if decode_shadow_at(image, frames_end, salt) is not None:
            assert got == acked + batch, name  # the write reached the disk whole: nothing cut
        end = plan.tail_offset
        if end < frames_end and image[end : end + 8] == after[end : end + 8]:
            assert plan.repair is not None, name  # a frame of the write begins there: cut, logged


def test_torn_write_cut_is_logged_with_a_broken_copy(
    state_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    acked = build(state_dir, WRITES)
    seg = seg_path(state_dir)
    before = seg.read_bytes()
    start = frames_on_disk(seg)[-1].end
    wal, _ = open_wal(state_dir)
    anyio.run(_group, wal, [b"x" * 700, b"y" * 700])
    wal.close()
    after = seg.read_bytes()
    torn = after[: start + 600] + before[start + 600 :]  # the first sector pieces only
    seg.write_bytes(torn)
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        assert payloads_of(state_dir) == acked
    assert any("cut a torn tail" in r.getMessage() for r in caplog.records)
    assert brokens(state_dir) == ["00000000.broken.0"]


# -- segments written before shadows ------------------------------------------------------------


def test_v3_segment_replays_and_the_next_write_starts_a_v4_life(state_dir: str) -> None:
    salt = 0x1234_5678_9ABC_DEF1
    image = bytearray(OPTIONS.segment_size)
    image[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, 1, version=3))
    offset = SEGMENT_HEADER_SIZE
    for lsn in (1, 2, 3):
        frame = encode_frame(salt, lsn, lsn, b"old %d" % lsn)
        image[offset : offset + len(frame)] = frame
        offset += len(frame)
    os.makedirs(Path(state_dir) / "wal", mode=0o700)
    os.chmod(state_dir, 0o700)
    seg_path(state_dir).write_bytes(bytes(image))
    os.chmod(seg_path(state_dir), 0o600)
    wal, frames = open_wal(state_dir)
    assert [f.payload for f in frames] == [b"old 1", b"old 2", b"old 3"]
    wal.append_sync(b"new 4")
    wal.close()
    assert seg_path(state_dir).read_bytes() == bytes(image)  # the v3 life is left as it was
    header = decode_segment_header(seg_path(state_dir, 1).read_bytes())
    assert header is not None and header.version == 4 and header.first_lsn == 4
    assert payloads_of(state_dir) == [b"old 1", b"old 2", b"old 3", b"new 4"]


def test_v3_damaged_tail_is_still_cut_as_before(state_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    salt = 0x1234_5678_9ABC_DEF1
    image = bytearray(OPTIONS.segment_size)
    image[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, 1, version=3))
    offset, last = SEGMENT_HEADER_SIZE, 0
    for lsn in (1, 2):
        frame = encode_frame(salt, lsn, lsn, b"old %d" % lsn)
        image[offset : offset + len(frame)] = frame
        last, offset = offset, offset + len(frame)
    image[last + FRAME_HEADER_SIZE] ^= 1
    os.makedirs(Path(state_dir) / "wal", mode=0o700)
    os.chmod(state_dir, 0o700)
    seg_path(state_dir).write_bytes(bytes(image))
    os.chmod(seg_path(state_dir), 0o600)
    with caplog.at_level(logging.WARNING, logger="afterword.wal"):
        assert payloads_of(state_dir) == [b"old 1"]
    assert any("cut a torn tail" in r.getMessage() for r in caplog.records)
