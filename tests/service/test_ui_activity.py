"""The status page's last-hour ring (pure, driven by hand-made records and a fake clock), the
chart's geometry, and `afterword continuations ui [--open] [--json]` against a live service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from _ui import NeverConfirms, sign_in
from fakes import Clock
from fakes.harness import make_config, running

from afterword.cli.main import main as cli_main
from afterword.continuations.model import Claim, Continuation, Receipt, ResultRecord
from afterword.disk.scratch import remove_private_scratch
from afterword.http.ui.activity import MINUTE_MS, MINUTES, ActivityRing, percentile
from afterword.http.ui.chart import HEIGHT, chart_rows

T0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE_MS  # a minute boundary


def record(state: str, *, received_ms: int | None = None, delivered_ms: int | None = None) -> Continuation:
    claim = Claim(
        id="c_x",
        kind="detached",
        server_name="svc",
        run_id=None,
        conversation_id="local:x",
        reply_to=None,
        route="r",
        mode="notify_if_actionable",
        task_key="k",
        task_hash="h",
        deadline_ms=T0 + 10**9,
        fingerprint="f",
        created_at_ms=T0,
    )
    rec = Continuation(claim=claim, claim_mac="m", origin_context="detached_latest")
    if received_ms is not None:
        result = ResultRecord(idempotency_key="i", payload_hash="p", payload=b"", received_at_ms=received_ms)
        rec = msgspec.structs.replace(rec, result=result)
    if delivered_ms is not None:
        rec = msgspec.structs.replace(rec, receipt=Receipt(kind="posted", delivered_at_ms=delivered_ms))
    return msgspec.structs.replace(rec, state=state)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def test_the_ring_counts_per_minute_and_forgets_after_an_hour() -> None:
    clock = FakeClock()
    ring = ActivityRing(clock)
    claimed = record("claimed")
    ring.observe(None, claimed)
    ring.observe(None, claimed)
    ring.observe(claimed, record("claimed"))  # no state change: not counted
    clock.now += MINUTE_MS + 5
    got = record("result_received", received_ms=clock.now - 1000)
    ring.observe(got, record("delivered", received_ms=clock.now - 1000, delivered_ms=clock.now))
    ring.observe(got, record("delivery_retry"))
    ring.observe(got, record("dead_lettered"))
    s = ring.summary()
    assert len(s.minutes) == MINUTES
    assert [(m.claims, m.deliveries, m.failures) for m in s.minutes[-2:]] == [(2, 0, 0), (0, 1, 2)]
    assert s.p50_ms == s.p99_ms == 1000 and s.samples == 1
    assert s.since_ms == T0  # counting began at the start, within the hour
    clock.now += MINUTES * MINUTE_MS
    later = ring.summary()
    assert sum(m.claims + m.deliveries + m.failures for m in later.minutes) == 0
    assert later.p50_ms is None and later.since_ms > T0


def test_operator_verbs_are_not_failures_in_the_chart() -> None:
    """Leaving a final state is an operator's act (retry of a dead letter, a verdict on an
    unknown delivery): the failure it follows was counted when it happened, once."""
    ring = ActivityRing(FakeClock())
    sending = record("ready_to_deliver", received_ms=T0)
    dead = record("dead_lettered")
    unknown = record("delivery_unknown")
    ring.observe(sending, dead)  # a failure
    ring.observe(dead, record("delivery_retry"))  # afterword continuations retry
    ring.observe(sending, unknown)  # a failure
    ring.observe(unknown, record("delivery_retry"))  # resolve not-delivered
    ring.observe(unknown, record("dead_lettered"))  # resolve dead-lettered
    ring.observe(record("delivery_retry"), unknown)  # the retried post failed again: a failure
    assert ring.summary().minutes[-1].failures == 3


def test_percentiles_and_chart_geometry() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50 and percentile(values, 0.99) == 99 and percentile([], 0.5) is None
    clock = FakeClock()
    ring = ActivityRing(clock)
    for _ in range(4):
        ring.observe(None, record("claimed"))
    clock.now += MINUTE_MS
    ring.observe(None, record("claimed"))
    claims, deliveries, failures, latency = chart_rows(ring.summary())
    assert (claims.total, claims.peak, len(claims.bars)) == (5, 4, 2)
    tall, short = claims.bars
    assert tall.height == HEIGHT and short.height == HEIGHT // 4 and tall.x < short.x
    assert tall.title.endswith("UTC: 4")
    assert deliveries.bars == failures.bars == latency.bars == ()


@pytest.mark.anyio
async def test_the_cli_prints_or_opens_a_one_time_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config, env = make_config(tmp_path)
    opened: list[str] = []
    cleanups: list[tuple[str, float]] = []

    def browser(uri: str) -> bool:
        # what a browser would read, at the moment it is started
        opened.append(Path(uri.removeprefix("file://")).read_text())
        return True

    monkeypatch.setattr("webbrowser.open", browser)
    monkeypatch.setattr("afterword.cli.loginpage._spawn_cleaner", lambda *a: cleanups.append(a))
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()) as h:
        argv = ["continuations", "ui", "--config", str(config.config_path)]
        assert await anyio.to_thread.run_sync(cli_main, argv) == 0
        out = capsys.readouterr()
        (url,) = out.out.split()
        assert url.startswith(h.service.base_url + "/ui/login?token=") and "valid once" in out.err
        assert h.service.operator_token() not in out.out + out.err
        assert await anyio.to_thread.run_sync(cli_main, [*argv, "--open", "--json"]) == 0
        body: dict[str, Any] = json.loads(capsys.readouterr().out)
        # the browser got a file that forwards to the link (tests/e2e/test_ui_open.py has more)
        assert set(body) == {"loginUrl", "expiresAt"} and len(opened) == 1
        assert f'content="0;url={body["loginUrl"]}"' in opened[0] and len(cleanups) == 1
        remove_private_scratch(cleanups[0][0])  # the cleaner this test did not start
        async with httpx.AsyncClient(trust_env=False) as client:
            # each printed link works once
            for link in (url, body["loginUrl"]):
                assert (await client.get(link)).status_code == 200
                assert (await client.get(link)).status_code == 401
            ui = await sign_in(client, h.service)
            page = await ui.get("/ui/")
            assert "in memory" in page.text and page.text.count('<svg class="chart') == 4
