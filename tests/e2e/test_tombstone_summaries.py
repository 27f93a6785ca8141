"""Tombstones stay unread at start: the service indexes them from the catalog's summaries
and reads a tombstone's file only when something asks for it (docs/performance.md, "Store
open"). What it answers from summaries must equal what the whole tombstones say."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _service import ENV, load, write_config

import afterword
from afterword.app.keys import ServiceKeys
from afterword.app.repository import LIVE, TOMB, Repository
from afterword.app.tombstones import SUMMARIZER
from afterword.continuations.capabilities import continuation_id, fingerprint
from afterword.continuations.health import assess
from afterword.continuations.model import Claim, Continuation, Receipt, Tombstone, encode
from afterword.continuations.retention import RetentionLimits, plan_retention
from afterword.store import Delete, Put, Record, RecordStore, Summarizer
from afterword.store.catalog import decode_catalog
from afterword.store.codec import RecordImage, decode_record, encode_record

pytestmark = pytest.mark.anyio

DAY = 86_400_000
ROUTES = ("daily-attention", "verification", "background-index")


def _claim(keys: ServiceKeys, server: str, key: str, route: str, created: int) -> Claim:
    mode = "notify_if_actionable"
    return Claim(
        id=continuation_id(keys.ids, "detached", server, key),
        kind="detached",
        server_name=server,
        run_id=None,
        conversation_id="c",
        reply_to=None,
        route=route,
        mode=mode,
        task_key=key,
        task_hash="h" + key,
        deadline_ms=created + DAY,
        fingerprint=fingerprint(None, server, "c", None, mode, route),
        created_at_ms=created,
    )


def tombstones(keys: ServiceKeys, n: int, now: int) -> Iterator[Tombstone]:
    """Varied tombstones: every terminal state, acknowledged or not, three routes, two
    servers, a delivery missing from history, and some past the default age limit."""
    for i in range(n):
        state = ("delivered", "expired", "cancelled", "dead_lettered", "delivery_unknown")[i % 5]
        claim = _claim(keys, ("work-control", "other")[i % 2], f"t{i}", ROUTES[i % 3], now - (n - i) * 1000)
        receipt = None
        if state == "delivered":
            receipt = Receipt(kind="captured", delivered_at_ms=now, history_recorded=i % 7 != 0)
        yield Tombstone(
            claim=claim,
            claim_mac=keys.mac(claim),
            state=state,
            idempotency_key=f"k{i}",
            payload_hash="0" * 64,
            completion_kind="synthesized",
            receipt=receipt,
            terminal_at_ms=now - (400 * DAY if i % 11 == 0 else i),
            acknowledged_at_ms=now if i % 3 == 0 else None,
        )


def fill(state_dir: str, n_live: int, n_tombs: int, *, summaries: bool = True) -> None:
    """Write records straight into the store and checkpoint; with ``summaries`` the
    repository is attached first, as in a running service, so the catalog carries them."""
    with RecordStore.open(state_dir) as store:
        keys = ServiceKeys.derive(store.secret)
        now = int(time.time() * 1000)
        puts = [Put(TOMB + t.claim.id, encode(t)) for t in tombstones(keys, n_tombs, now)]
        for i in range(n_live):
            claim = _claim(keys, "work-control", f"a{i}", ROUTES[i % 3], now - i * 500)
            rec = Continuation(claim=claim, claim_mac=keys.mac(claim), origin_context="detached_latest")
            puts.append(Put(LIVE + claim.id, encode(rec)))
        store.transact_sync(puts)
        if summaries:
            Repository(store)
        store.checkpoint_sync()


# -- the store: summaries in the catalog ----------------------------------------------------------
def test_store_hands_over_summaries_and_keeps_them_unread(tmp_path: Path) -> None:
    assert SUMMARIZER.tag.startswith("tombstone-summary/")
    state = str(tmp_path / "s")
    tag = Summarizer("test/1", lambda value: value[:3])
    with RecordStore.open(state) as store:
        store.watch("t/", lambda *_: None, tag)
        store.transact_sync([Put("t/a", b"aaa-1"), Put("t/b", b"bbb-1"), Put("c/z", b"zzz")])
        store.checkpoint_sync()
    body = decode_catalog((tmp_path / "s" / "CATALOG").read_bytes())
    assert body.tags == {"t/": "test/1"}
    assert {e.key: e.summary for e in body.entries} == {"t/a": b"aaa", "t/b": b"bbb", "c/z": b""}

    seen: list[tuple[str, Record | None, Record | None]] = []
    with RecordStore.open(state) as store:
        found = store.watch("t/", lambda k, o, n: seen.append((k, o, n)), tag)
        assert sorted(found) == [("t/a", b"aaa"), ("t/b", b"bbb")] and seen == []
        assert store.statistics().unread == 3  # nothing read
        store.transact_sync([Put("c/y", b"y")])
        store.checkpoint_sync()  # with the summarizer: unread summaries carried over
    with RecordStore.open(state) as store:  # without one: a checkpoint keeps them too
        store.transact_sync([Put("c/x", b"x")])
        store.checkpoint_sync()
    with RecordStore.open(state) as store:
        found = store.watch("t/", lambda k, o, n: seen.append((k, o, n)), tag)
        assert sorted(found) == [("t/a", b"aaa"), ("t/b", b"bbb")] and seen == []
        # Deleting a record its watcher knows only by summary is still reported.
        store.transact_sync([Delete("t/a")])
        assert seen == [("t/a", None, None)]
    with RecordStore.open(state) as store:  # another tag: those summaries are not used
        found = store.watch("t/", lambda k, o, n: seen.append((k, o, n)), Summarizer("test/2", bytes))
        assert found == [] and [k for k, _, n in seen[1:] if n is not None] == ["t/b"]


# -- the service: indexes, health, pages and retention from summaries ------------------------------
async def test_service_starts_without_reading_tombstones_and_answers_the_same(tmp_path: Path) -> None:
    config = load(write_config(tmp_path, continuations={"limits": {"operatorPageSize": 7}}))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False):
        pass
    fill(str(config.state_dir), 6, 60)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        repo = service.repo
        summaries = repo.tombstone_summaries()
        # Retention at open dropped the tombstones past the age limit, from summaries alone.
        assert len(summaries) == 60 - sum(1 for i in range(60) if i % 11 == 0 and not needs_operator(i))
        assert service.store.statistics().unread == len(summaries)  # not one tombstone read
        health = service.continuation_health()
        counts = dict(repo.state_counts)
        now = int(time.time() * 1000)
        plan = plan_retention(repo.live(), summaries, now, LIMITS)
        assert service.store.statistics().unread == len(summaries)  # still none read
        newest = service.list_continuations(newest_first=True, state="delivered")
        # A filtered page reads only the tombstones it returns.
        assert service.store.statistics().unread == len(summaries) - len(newest.items)
        pages = {tuple(f.items()): list_all(service, **f) for f in FILTERS}
        # The same answers from the whole tombstones.
        tombs = list(repo.tombstones())
        assert service.store.statistics().unread == 0
        everything = sorted([*repo.live(), *tombs], key=lambda r: (r.claim.created_at_ms, r.claim.id))
        reference = assess(repo.live(), tombs, id_limit=100, config_path=config.config_path)
        assert health.status == reference.status and health.counts == dict(reference.counts)
        assert [(c.code, c.count, c.ids, c.commands) for c in health.causes] == [
            (c.code, c.count, list(c.ids), list(c.commands)) for c in reference.causes
        ]
        assert +Counter(counts) == Counter(r.state for r in everything)
        assert plan == plan_retention(repo.live(), tombs, now, LIMITS) and plan.drop
        assert [i.continuation_id for i in newest.items] == [
            r.claim.id for r in reversed(everything) if matches(r, state="delivered")
        ][: len(newest.items)]
        for f, ids in pages.items():
            assert ids == [r.claim.id for r in everything if matches(r, **dict(f))], f


def needs_operator(i: int) -> bool:
    state = ("delivered", "expired", "cancelled", "dead_lettered", "delivery_unknown")[i % 5]
    if state == "delivery_unknown":
        return True
    if i % 3 == 0:
        return False
    return state in ("expired", "dead_lettered") or (state == "delivered" and i % 7 == 0)


LIMITS = RetentionLimits(
    terminal_max_records=20,
    terminal_max_age_ms=30 * DAY,
    captured_text_max_records=1,
    captured_text_max_age_ms=DAY,
)
FILTERS = (
    {},
    {"state": "delivered"},
    {"route": "verification"},
    {"server": "other", "state": "expired"},
)


def matches(
    rec: Continuation | Tombstone,
    state: str | None = None,
    server: str | None = None,
    route: str | None = None,
) -> bool:
    return (
        (state is None or rec.state == state)
        and (server is None or rec.claim.server_name == server)
        and (route is None or rec.claim.route == route)
    )


def list_all(service: afterword.ContinuationService, **filters: str) -> list[str]:
    """Every id through keyset pages, oldest first."""
    ids: list[str] = []
    cursor = None
    while True:
        page = service.list_continuations(cursor=cursor, **filters)
        ids += [item.continuation_id for item in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return ids


async def test_catalog_without_summaries_is_read_once_then_summarized(tmp_path: Path) -> None:
    """A catalog an older version (or a tool) wrote has no summaries: the service reads the
    tombstones, as before, and checkpoints so that the next start reads none."""
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False):
        pass
    fill(str(config.state_dir), 2, 20, summaries=False)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        assert service.repo.tombstones_unsummarized > 0
        first = service.continuation_health()
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        assert service.repo.tombstones_unsummarized == 0
        assert service.store.statistics().unread == len(service.repo.tombstone_summaries()) > 0
        assert service.continuation_health() == first


# -- fail closed at the first read ------------------------------------------------------------------
async def _one_tombstone(config_path: Path, task_key: str, deadline_text: str) -> tuple[str, str]:
    """A cancelled continuation compacted into a tombstone and checkpointed with its summary;
    returns (id, result token)."""
    from _service import DETACHED_TOKEN

    from afterword.protocol.wire import DetachedClaimRequest

    config = afterword.load_config(config_path, environ=ENV)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        claim = await service.detached_claim(
            "svc",
            DETACHED_TOKEN,
            DetachedClaimRequest(
                route="ok", task_key=task_key, task_hash="h-" + task_key, deadline=deadline_text
            ),
        )
        await service.cancel_continuation(claim.continuation_id)
        assert (await service.apply_retention())[0] == 1
        await service.store.checkpoint()
        return claim.continuation_id, claim.result_token


def _tombstone_file(config_path: Path, cid: str) -> Path:
    from afterword.store.codec import record_file_name

    return config_path.parent / "state" / "records" / record_file_name(TOMB + cid)


async def test_damaged_tombstone_is_refused_at_first_read_over_http_and_cli(tmp_path: Path) -> None:
    """serve starts over a tombstone made world-readable after the checkpoint (it is not
    read at start), and refuses it at its first read: the idempotent claim retry gets the
    error envelope naming the store's rule, health names the record, the operator CLI prints
    one line and exits non-zero, and doctor still finds it."""
    from _cli import cli, run_cli, served, write_operator_config
    from _service import DETACHED_TOKEN, deadline

    config_path = write_operator_config(tmp_path, "http://127.0.0.1:9/")
    when = deadline()
    cid, _token = await _one_tombstone(config_path, "damaged", when)
    os.chmod(_tombstone_file(config_path, cid), 0o644)
    with served(config_path) as server:
        health = server.http.get(server.base + "/v1/operator/health", headers=operator_headers(config_path))
        assert health.json()["status"] == "healthy"  # not read yet
        retry = server.http.post(
            server.base + "/v1/continuations/detached/claim",
            headers={"Authorization": f"Bearer {DETACHED_TOKEN}", "X-Mono-Agent-Service-Name": "svc"},
            json={"route": "ok", "taskKey": "damaged", "taskHash": "h-damaged", "deadline": when},
        )
        assert retry.status_code == 500
        error = retry.json()["error"]
        assert error["code"] == "state_corrupt" and "permissive_mode" in error["message"]
        assert str(tmp_path) not in error["message"]  # no state path to an HTTP client
        health = server.http.get(server.base + "/v1/operator/health", headers=operator_headers(config_path))
        body = health.json()
        assert body["status"] == "unhealthy" and body["causes"][0]["code"] == "state_corrupt"
        assert body["causes"][0]["ids"] == [TOMB + cid]
        code, out, err = cli(server, "continuations", "show", cid)
        assert code != 0 and out == "" and len(err.strip().splitlines()) == 1
        assert "state_corrupt" in err or "cannot be read" in err
        assert "permissive_mode" in err
    doctor = run_cli("continuations", "doctor", config=config_path)
    assert doctor.returncode != 0 and "permissive_mode" in doctor.stdout + doctor.stderr


def operator_headers(config_path: Path) -> dict[str, str]:
    from afterword.clients.operator import read_operator_token

    return {"Authorization": "Bearer " + read_operator_token(afterword.load_config(config_path, environ=ENV))}


@pytest.mark.parametrize("damage", ["garbled", "rolled_back"])
async def test_damaged_tombstone_in_process(tmp_path: Path, damage: str) -> None:
    """The same refusal, in process, for the other kinds of damage: a garbled file (its
    checksum) and an older version of the record put back (the catalog's version)."""
    from _cli import write_operator_config
    from _service import deadline

    from afterword.app.repository import IndexCorrupt

    config_path = write_operator_config(tmp_path, "http://127.0.0.1:9/")
    cid, token = await _one_tombstone(config_path, "x", deadline())
    path = _tombstone_file(config_path, cid)
    data = path.read_bytes()
    if damage == "garbled":
        path.write_bytes(data[:-9] + bytes([data[-9] ^ 0xFF]) + data[-8:])
    else:  # a valid record file, but not the version the checkpoint recorded
        image = decode_record(data, path.name)
        path.write_bytes(encode_record(RecordImage(image.key, image.lsn - 1, image.value, image.blobs)))
    config = afterword.load_config(config_path, environ=ENV)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        with pytest.raises(IndexCorrupt) as refused:
            service.status(cid, token)
        assert refused.value.key == TOMB + cid
        assert refused.value.rule == ("corrupt" if damage == "garbled" else "record_digest")
        with pytest.raises(IndexCorrupt):  # and every later use, until inspected and reopened
            service.list_continuations()
        assert service.continuation_health().causes[0].ids == [TOMB + cid]


async def test_indexes_follow_changes_to_tombstones_known_only_by_summary(tmp_path: Path) -> None:
    """After the keyset order is built: a live record compacted, an unread tombstone
    replaced (acknowledged) and one deleted keep the indexes equal to the records."""
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False):
        pass
    fill(str(config.state_dir), 4, 30)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        repo = service.repo
        before = list_all(service)  # builds the order
        recent = int(time.time() * 1000) - DAY  # (old ones are dropped once acknowledged)
        expired = next(
            s.id for s in repo.tombstone_summaries() if s.cause == "expired" and s.terminal_at_ms > recent
        )
        await service.acknowledge_continuation(expired)  # a new version of an unread tombstone
        assert repo.tombstone_summaries() and repo.has_tombstone(expired)
        gone = next(s for s in repo.tombstone_summaries() if s.cause is None and s.id != expired)
        await service.store.transact([Delete(TOMB + gone.id)])  # as retention drops one
        cancelled = next(iter(repo.live())).id
        await service.cancel_continuation(cancelled)
        assert (await service.apply_retention())[0] == 1  # compacted: c/ deleted, t/ put
        tombs = list(repo.tombstones())
        everything = sorted([*repo.live(), *tombs], key=lambda r: (r.claim.created_at_ms, r.claim.id))
        assert list_all(service) == [r.claim.id for r in everything]
        assert len(before) == len(everything) + 1 and gone.id not in [r.claim.id for r in everything]
        assert +Counter(repo.state_counts) == Counter(r.state for r in everything)
        assert next(t for t in tombs if t.claim.id == expired).acknowledged_at_ms is not None
        health = service.continuation_health()
        assert expired not in [i for c in health.causes for i in c.ids]
        assert health == service.continuation_health()  # from summaries, stable


async def test_start_survives_a_refused_summary_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpoint that records missing summaries is only a speed-up: one refused for lack
    of space is logged and the service starts anyway (the next start reads the tombstones)."""
    from afterword.disk import StorageFullError

    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False):
        pass
    fill(str(config.state_dir), 1, 5, summaries=False)

    async def full(self: RecordStore) -> None:
        raise StorageFullError(str(tmp_path), 28)

    monkeypatch.setattr(RecordStore, "checkpoint", full)
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        assert service.repo.tombstones_unsummarized == 5
    assert "no checkpoint to record tombstone summaries" in caplog.text
