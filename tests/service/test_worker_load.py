"""Exactly one delivery per continuation under concurrent producers and racing dispatches."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest
from fakes.harness import make_config, running
from fakes.producer import Claimed, reply_run, wait_state
from fakes.synth import RecordingSynth

from afterword.continuations.errors import InvalidTransition
from afterword.store import VersionConflict

N = 50


@pytest.mark.anyio
async def test_fifty_concurrent_continuations_are_each_delivered_exactly_once(tmp_path: Path) -> None:
    synth = RecordingSynth("answer")
    config, env = make_config(tmp_path, {"limits": {"maxConcurrent": 8}})
    claims: dict[int, Claimed] = {}
    async with running(config, env, synthesizer=synth) as h:

        async def produce(i: int) -> None:
            claimed = await reply_run(
                h.service, h.producer, {"n": i}, run_id=f"run-{i}", reply_to=f"slack:C{i}:T{i}"
            )
            claims[i] = claimed
            # Race the worker loop with extra dispatches of the same record: the durable
            # synthesizing / delivery_in_flight marks must make every extra one a no-op.
            for _ in range(3):
                for step in (h.worker.synthesize, h.worker.deliver):
                    try:
                        await step(claimed.id)
                    except (InvalidTransition, VersionConflict):
                        pass
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            for i in range(N):
                tg.start_soon(produce, i)
        records = [await wait_state(h.service, c.id) for c in claims.values()]
        await h.after_full_scan()  # any (wrong) second delivery has been written by now
        lines = h.outbox()

    assert all(r.state == "delivered" for r in records)
    assert all((r.attempts.synthesis, r.attempts.delivery) == (1, 1) for r in records)
    keys = Counter(line["deliveryKey"] for line in lines)
    assert len(lines) == N and set(keys.values()) == {1}
    assert set(keys) == {f"{c.id}:0" for c in claims.values()}
    routes = {line["deliveryKey"]: line["conversationId"] for line in lines}
    assert all(routes[f"{c.id}:0"] == f"slack:C{i}:T{i}" for i, c in claims.items())
    assert len(synth.calls) == N
