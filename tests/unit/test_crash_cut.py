"""Crash cut: destroy the WAL from some byte on, reopen, and get exactly a committed prefix.

A workload runs against a real store (a checkpoint first, so the log recycles old segments,
then sync and group-committed transactions that cross several segment boundaries). For each
cut point of the written log region the tail from that byte on is replaced with zeros,
random garbage, or the bytes the recycled slot held before (what a power loss really
leaves), and the store is reopened: it must hold exactly the state after some prefix of the
transactions, that prefix must include every transaction whose frame lies wholly before the
cut, a second reopen must see the same state, and the log must accept a new commit.

Expectations are taken from the first byte the filler actually changed, not from the cut: a
filler may write back the byte it replaces (random garbage equal to a checksum byte, a zero
over a zero), and the salted checksums differ on every run, so judging by the cut made the
verdict on the cut through a header's last byte a 1-in-256 coin toss per run. The group write
is queued whole before it leads, so the log's layout is the same on every run too.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from _disk_helpers import abandon
from _highwater import mark_back

from afterword.disk import NoSyncDisk
from afterword.store import Delete, Mutation, PendingCommit, Put, RecordStore, StoreOptions
from afterword.store.evidence import EvidenceError
from afterword.wal import WalEvidenceError, WalOptions
from afterword.wal.layout import (
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    decode_frame_at,
    decode_segment_header,
)
from afterword.wal.shadow import decode_shadow_at, shadow_size
from afterword.wal.testing import inline_by_batch_only

WAL = WalOptions(segment_size=2304, max_payload=1024, max_log_bytes=1 << 20)
OPTIONS = StoreOptions(wal=WAL, auto_checkpoint=False, checkpoint_threads=1)
RANDOM_CUTS = 60

State = dict[str, tuple[int, bytes]]  # key -> (version lsn, value)


DISK = NoSyncDisk()


def snapshot(store: RecordStore) -> State:
    return {r.key: (r.lsn, r.value) for r in store.items()}


def value(tag: str, size: int) -> bytes:
    return (tag.encode() * size)[:size]


@dataclass
class ChainFrame:
    lsn: int
    start: int  # global offset in the concatenated written log region
    payload_end: int  # global offset just past the payload (padding excluded)
    end: int  # global offset just past the padded frame


@dataclass
class Workload:
    final_dir: Path
    base_images: dict[str, bytes]  # wal file name -> bytes right after the checkpoint
    final_images: dict[str, bytes]  # wal file name -> bytes at the end of the workload
    chain: list[tuple[str, int, int]]  # (file name, global start, written length), seq order
    frames: list[ChainFrame]
    states: list[State]  # states[i]: after the first i transactions of the log
    checkpoint_lsn: int
    manifest: bytes  # MANIFEST as the killed writer left it
    acked_prefix: int  # transactions its acked_lsn vouches for (damage below that is refused)


def _phase_two() -> list[list[Mutation]]:
    """Overwrites, deletes, resurrection, multi-op, and sizes that cross segment boundaries."""
    txs: list[list[Mutation]] = []
    for i in range(22):
        size = (37 * i * i + 11) % 700 + 1
        match i % 6:
            case 0:
                txs.append([Put("k/a", value(f"a{i}", size))])
            case 1:
                txs.append([Put(f"k/n{i}", value(f"n{i}", size)), Put("k/b", value(f"b{i}", 9))])
            case 2:
                txs.append([Delete("k/a")])
            case 3:
                txs.append([Put("k/a", value(f"r{i}", size)), Delete(f"k/n{i - 2}")])
            case 4:
                txs.append([Delete("k/absent"), Put("k/c", b"")])
            case _:
                txs.append([Put(f"k/m{j}", value(f"m{i}{j}", size // 3)) for j in range(3)])
    return txs


def _apply(state: State, lsn: int, mutations: list[Mutation]) -> State:
    state = dict(state)
    for m in mutations:
        if isinstance(m, Put):
            state[m.key] = (lsn, m.value)
        else:
            state.pop(m.key, None)
    return state


def _wal_images(state_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((state_dir / "wal").glob("*.seg"))}


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Workload:
    parent = tmp_path_factory.mktemp("crash-cut")
    os.chmod(parent, 0o700)
    state_dir = parent / "state"
    store = RecordStore.open(str(state_dir), options=OPTIONS)
    for i in range(8):  # phase one: fills two segments, then a checkpoint retires them
        store.transact_sync([Put(f"k/p{i % 3}", value(f"p{i}", 300)), Put("k/a", value(f"a{i}", 40))])
    store.transact_sync([Delete("k/p1"), Put("k/c", b"checkpointed")])
    store.checkpoint_sync()
    checkpoint_lsn = store.manifest.checkpoint_lsn
    base_state = snapshot(store)
    base_images = _wal_images(state_dir)

    log: list[tuple[int, list[Mutation]]] = []
    txs = _phase_two()
    for mutations in txs[:14]:
        log.append((store.transact_sync(mutations), mutations))

    async def group(batch: list[list[Mutation]]) -> None:
        # Every frame is queued before the first wait leads, so the group write holds all
        # six whatever the scheduling: the log's layout is the same on every run.
        pending = [(store.reserve(mutations), mutations) for mutations in batch]

        async def one(commit: PendingCommit, mutations: list[Mutation]) -> None:
            log.append((await commit.wait(), mutations))

        async with anyio.create_task_group() as tg:
            for commit, mutations in pending:
                tg.start_soon(one, commit, mutations)

    with inline_by_batch_only():
        anyio.run(group, txs[14:20])  # group commit: several frames share one write
    assert store.wal.stats.max_batch == 6
    for mutations in txs[20:]:
        log.append((store.transact_sync(mutations), mutations))
    final_state = snapshot(store)
    start_seq = store.manifest.wal_start_seq
    acked_prefix = store.manifest.acked_lsn - checkpoint_lsn
    abandon(store)  # killed: a clean close would vouch for every frame
    manifest = (state_dir / "MANIFEST").read_bytes()

    log.sort(key=lambda item: item[0])
    assert [lsn for lsn, _ in log] == list(range(checkpoint_lsn + 1, checkpoint_lsn + 1 + len(log)))
    states = [base_state]
    for lsn, mutations in log:
        states.append(_apply(states[-1], lsn, mutations))
    assert states[-1] == final_state

    final_images = _wal_images(state_dir)
    headed = []
    for name, data in final_images.items():
        header = decode_segment_header(data)
        if header is not None and header.seq >= start_seq:
            headed.append((header.seq, name, header.salt))
    headed.sort()
    chain: list[tuple[str, int, int]] = []
    frames: list[ChainFrame] = []
    base = 0
    for _, name, salt in headed:
        data = final_images[name]
        offset = SEGMENT_HEADER_SIZE
        while (frame := decode_frame_at(data, offset, salt, WAL.max_payload)) is not None:
            frames.append(
                ChainFrame(
                    frame.lsn,
                    base + offset,
                    base + offset + FRAME_HEADER_SIZE + len(frame.payload),
                    base + frame.end,
                )
            )
            offset = frame.end
        # The segment's last write left its shadow copy behind its frames: a cut destroys
        # that too (a surviving shadow would prove the write whole, and restore it).
        shadow = decode_shadow_at(data, offset, salt)
        end = offset if shadow is None else offset + shadow_size(len(shadow.copy))
        chain.append((name, base, end))
        base += end
    assert [f.lsn for f in frames] == [lsn for lsn, _ in log]
    assert len(chain) >= 4, "the workload must cross several segment boundaries"
    assert any(name in base_images for name, _, _ in chain), "a recycled slot must be in the chain"
    assert 0 < acked_prefix < len(frames)
    return Workload(
        state_dir, base_images, final_images, chain, frames, states, checkpoint_lsn, manifest, acked_prefix
    )


def cut_points(w: Workload) -> list[int]:
    total = w.chain[-1][1] + w.chain[-1][2]
    points = {0, total - 1, total}
    for _, start, _ in w.chain:
        points.update(start + d for d in (0, 1, 4, 7, 8, 9, 63, 64, 65))
    for f in w.frames:
        points.update(f.start + d for d in (-1, 0, 1, 4, 7, 8, 9, 32, 33))
        points.update(f.payload_end + d for d in (-1, 0, 1))
        points.update(f.end + d for d in (-1, 0))
    rng = random.Random(20240611)
    points.update(rng.randrange(total + 1) for _ in range(RANDOM_CUTS))
    return sorted(p for p in points if 0 <= p <= total)


def cut_images(w: Workload, cut: int, filler: str) -> dict[str, bytes]:
    images = dict(w.final_images)
    for name, start, length in w.chain:
        local = min(max(cut - start, 0), length)
        if local == length:
            continue
        data = bytearray(images[name])
        if filler == "zeros":
            data[local:length] = bytes(length - local)
        elif filler == "garbage":
            data[local:length] = random.Random(f"{cut}/{name}").randbytes(length - local)
        else:  # what the slot held before this segment life wrote there
            old = w.base_images.get(name, bytes(len(data)))
            data[local:length] = old[local:length]
        images[name] = bytes(data)
    return images


def first_changed(w: Workload, images: dict[str, bytes]) -> int:
    """The global offset of the first chain byte ``images`` changed (the end if none).

    A filler can write back the very byte it replaces (a garbage byte equal to a checksum
    byte, a zero over a zero): the damage then starts later than the cut, and nothing
    before that offset was destroyed."""
    for name, start, length in w.chain:
        old, new = w.final_images[name][:length], images[name][:length]
        if old != new:
            return start + next(i for i in range(length) if old[i] != new[i])
    return w.chain[-1][1] + w.chain[-1][2]


def expectation(w: Workload, images: dict[str, bytes]) -> tuple[int, int, bool]:
    """``(whole, intact, vouched)`` for the damaged ``images``: the transactions whose padded
    frame, and whose checksummed bytes, lie before the first changed byte, and whether that
    damage reaches what the MANIFEST and the mark vouch for (a named header or one of the
    first ``acked_prefix`` frames), which the open must refuse."""
    damage = first_changed(w, images)
    whole = sum(1 for f in w.frames if f.end <= damage)
    intact = sum(1 for f in w.frames if f.payload_end <= damage)  # padding is not checksummed
    vouched = intact < w.acked_prefix or any(damage < start + SEGMENT_HEADER_SIZE for _, start, _ in w.chain)
    return whole, intact, vouched


def install(work: Path, images: dict[str, bytes], manifest: bytes, acked_lsn: int) -> None:
    """Put the WAL files back to ``images`` in place (same inodes, modes untouched), the
    MANIFEST the killed writer left (recovery and the probe commits rewrite it), and a
    HIGHWATER mark at ``acked_lsn``: the kill came right after the last write the MANIFEST
    vouches for, so every later write's fate is the cut's (issue 29 tests the mark itself)."""
    mark_back(str(work), acked_lsn)
    fd = os.open(work / "MANIFEST", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, manifest)
    finally:
        os.close(fd)
    wal_dir = work / "wal"
    for path in wal_dir.iterdir():
        if path.name not in images:
            path.unlink()  # .broken copies and segments made by the previous scenario
    for name, data in images.items():
        fd = os.open(wal_dir / name, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)


@pytest.mark.parametrize("filler", ["zeros", "garbage", "old-life"])
def test_every_cut_recovers_a_prefix_that_keeps_all_acknowledged(
    workload: Workload, filler: str, tmp_path: Path
) -> None:
    w = workload
    os.chmod(tmp_path, 0o700)
    work = tmp_path / "state"
    shutil.copytree(w.final_dir, work)
    points = cut_points(w)
    assert len(points) > 300
    failures: list[str] = []
    repairs = refusals = 0
    for cut in points:
        images = cut_images(w, cut, filler)
        install(work, images, w.manifest, w.checkpoint_lsn + w.acked_prefix)
        whole, intact, vouched = expectation(w, images)
        try:
            store = RecordStore.open(str(work), disk=DISK, options=OPTIONS)
        except (EvidenceError, WalEvidenceError) as exc:
            refusals += 1
            if not vouched:
                failures.append(f"cut {cut}: refused ({exc}) though nothing vouched for was lost")
            continue
        if vouched:
            store.close()
            failures.append(f"cut {cut}: opened though vouched-for data was destroyed")
            continue
        try:
            got = snapshot(store)
            prefix = store.wal.next_lsn - 1 - w.checkpoint_lsn
            repairs += bool(list((work / "wal").glob("*.broken.*")))
        finally:
            store.close()
        if not whole <= prefix <= intact or got != w.states[prefix]:
            failures.append(f"cut {cut}: recovered {prefix} transactions, expected {whole}..{intact}")
            continue
        with RecordStore.open(str(work), disk=DISK, options=OPTIONS) as again:  # replay twice == once
            if snapshot(again) != got or again.wal.next_lsn - 1 - w.checkpoint_lsn != prefix:
                failures.append(f"cut {cut}: second reopen differs")
                continue
            lsn = again.transact_sync([Put("k/after", value(f"x{cut}", 200 + cut % 300))])
        expected = _apply(got, lsn, [Put("k/after", value(f"x{cut}", 200 + cut % 300))])
        with RecordStore.open(str(work), disk=DISK, options=OPTIONS) as third:
            if lsn != w.checkpoint_lsn + prefix + 1 or snapshot(third) != expected:
                failures.append(f"cut {cut}: a commit after recovery did not survive reopen")
    assert not failures, "\n".join(failures[:20])
    assert repairs > 10  # torn frames were cut (and saved aside), not only clean ends
    assert refusals > 10  # and damage to what the MANIFEST vouches for was refused


def test_a_filler_that_writes_back_the_byte_it_cuts_destroys_nothing(
    workload: Workload, tmp_path: Path
) -> None:
    """A cut at the last byte of a named header whose filler happens to write that same byte
    back (a 1-in-256 chance for random garbage over a checksum byte) leaves the header whole:
    the open must accept it, and only a changed byte is damage it must refuse."""
    w = workload
    os.chmod(tmp_path, 0o700)
    work = tmp_path / "state"
    shutil.copytree(w.final_dir, work)
    name, start, length = w.chain[-1]
    cut = start + SEGMENT_HEADER_SIZE - 1
    kept = bytearray(w.final_images[name])
    kept[SEGMENT_HEADER_SIZE:length] = bytes(b ^ 0xA5 for b in kept[SEGMENT_HEADER_SIZE:length])
    images = dict(w.final_images, **{name: bytes(kept)})
    assert first_changed(w, images) == cut + 1
    whole, intact, vouched = expectation(w, images)
    assert not vouched
    install(work, images, w.manifest, w.checkpoint_lsn + w.acked_prefix)
    with RecordStore.open(str(work), disk=DISK, options=OPTIONS) as store:
        prefix = store.wal.next_lsn - 1 - w.checkpoint_lsn
        assert whole <= prefix <= intact and snapshot(store) == w.states[prefix]

    changed = bytearray(kept)
    changed[cut - start] ^= 0x01  # the same cut, now the header's last checksum byte differs
    images = dict(w.final_images, **{name: bytes(changed)})
    assert expectation(w, images)[2]
    install(work, images, w.manifest, w.checkpoint_lsn + w.acked_prefix)
    with pytest.raises((EvidenceError, WalEvidenceError)):
        RecordStore.open(str(work), disk=DISK, options=OPTIONS).close()
