"""The whole service under random sequences of public calls, crashes and restarts (issue 13).

Producers claim and submit over real loopback HTTP, hosts drive run bindings (and die at any
step of settlement), operators retry, cancel and resolve over the operator API, retention runs,
the process restarts cleanly or crashes at any commit point, and the scripted channel and
synthesizer accept, refuse, fail, time out or crash mid-post. After every step:

- I1: no chunk is posted twice unless an operator used the unsafe opt-in (``allowUnknown``);
- I2: the state directory always opens again (every restart checks it);
- I3: after the worker ran to quiescence, every accepted result has ended (delivered,
  captured, suppressed, silent, dead-lettered, unknown) or waits on a cause an operator sees;
- I4: health is a function of the records alone (an independent recount agrees);
- I5: no transaction the service writes exceeds the store's limits (the store's commit hook);
- I0: no public surface answers with an internal error while the process is alive;
- I6: an operator verb sent while a post is in flight either is refused with a 409 naming why
  or keeps the promise: a receipt the channel confirmed is on the record, and a crash in
  between still ends in ``delivery_unknown`` (I1 catches any repost).

CI runs a fixed seed and a few random examples (well under a minute). For a long run set
``AFTERWORD_STATEFUL_SECONDS`` (keep generating for that long) or
``AFTERWORD_STATEFUL_EXAMPLES``; ``AFTERWORD_STATEFUL_REPORT=path.json`` writes the figures.
See docs/crash-testing.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec
import pytest
from _world import ROUTES, SERVER, Run, Stats, Task, Violation, World
from fakes.scripted import CHANNEL_MODES, HISTORY_MODES, SYNTH_MODES
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from afterword.continuations.actions import next_action
from afterword.continuations.errors import ContinuationError, ServiceDisabled
from afterword.continuations.rules import MAX_RESULT_BODY, format_ms

F = TypeVar("F", bound=Callable[..., None])
DAY_MS = 24 * 3600 * 1000
CONTINUATIONS: dict[str, Any] = {
    "limits": {"synthesisTimeoutMs": 300, "deliveryTimeoutMs": 300, "operatorPageSize": 7},
    "retention": {
        "terminalMaxRecords": 8,
        "terminalMaxAgeMs": 7 * DAY_MS,
        "capturedTextMaxRecords": 2,
        "capturedTextMaxAgeMs": DAY_MS,
    },
}
# Repeats weight the draw towards the paths that post (where at-most-once can break).
MODES = ("reply", "reply", "notify_if_actionable", "capture", "silent")
DESTINATIONS = ("slack:C1:T1", "slack:C2:T7", "slack:C1:T1", "ghost:G1:T1")  # ghost: no channel
SIZES = {"small": 0, "large": 128 * 1024, "max": MAX_RESULT_BODY, "over": MAX_RESULT_BODY + 1}
HISTORIES: dict[str, list[dict[str, str]]] = {
    "short": [{"role": "user", "content": "index it"}, {"role": "assistant", "content": "started"}],
    # Over every snapshot cap: 80 messages, 70 KiB contents; whole old turns must be dropped.
    "long": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": ("word " * (14_000 if i % 9 == 0 else 20))}
        for i in range(80)
    ],
    "invalid": [{"role": "user", "content": "no answer yet"}],
}
TOTALS = Stats()
RULES: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _quiet_afterword_logs() -> Iterator[None]:
    """Crashes log by design; keep CI quiet, for this module's test only: a module-level
    setLevel leaked into every later test of the same process (under pytest-xdist, into
    whichever tests shared the worker)."""
    logger = logging.getLogger("afterword")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


picks = st.integers(0, 1 << 16)
# The operator verbs a race sends while a post is in flight: (path verb, body).
RACE_VERBS: dict[str, tuple[str, dict[str, Any]]] = {
    "cancel": ("cancel", {}),
    "retry": ("retry", {}),
    "retry-unsafe": ("retry", {"allowUnknown": True}),
    "resolve-delivered": ("resolve", {"kind": "delivered", "deliveryId": "verified-elsewhere"}),
    "resolve-not-delivered": ("resolve", {"kind": "not_delivered"}),
    "resolve-dead-lettered": ("resolve", {"kind": "dead_lettered"}),
    "acknowledge": ("acknowledge", {}),
}


def step(fn: F) -> F:
    """Each rule: run it, reopen if the process died during it, then check the invariants."""

    @functools.wraps(fn)
    def wrapper(self: ServiceMachine, *args: Any, **kwargs: Any) -> None:
        self.clean = False
        self.w.now_ms += 1_000  # distinct times keep retention's order reproducible
        RULES[fn.__name__] += 1
        fn(self, *args, **kwargs)
        self.w.after_step()
        self.w.check()
        self.w.stats.steps += 1
        self.clean = True

    return wrapper  # type: ignore[return-value]


def result_body(task: Task, size: str, chunks: int, actionable: bool, variant: str) -> bytes:
    payload: dict[str, Any] = {
        "summary": f"result {variant}",
        "actionable": actionable,
        "chunks": chunks,
        "pad": "",
    }

    def encode(pad: int) -> bytes:
        payload["pad"] = "x" * pad
        digest = hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()
        return msgspec.json.encode(
            {"idempotencyKey": f"key-{variant}", "payloadHash": digest, "payload": payload}
        )

    base = len(encode(0))
    return encode(max(0, SIZES[size] - base))


class ServiceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clean = True
        self.w = World(CONTINUATIONS)
        self.w.stats.examples = 1
        self.keys = 0
        self.large_runs = 0

    def teardown(self) -> None:
        try:
            if self.clean:  # a failed step already raised; do not mask it
                self.w.restart(crash=True)
                self.w.quiesce()
                self.w.check()
                self.w.check_settled(count=True)
        finally:
            self.w.close()
            TOTALS.add(self.w.stats)

    # -- picking -----------------------------------------------------------------------------
    def task(self, pick: int, prefer: Callable[[Task], bool] | None = None) -> Task | None:
        """A task, preferring (on even picks) those the rule can do something with."""
        tasks = self.w.tasks
        if prefer is not None and pick % 2 == 0:
            tasks = [t for t in tasks if prefer(t)] or tasks
        return tasks[(pick // 2) % len(tasks)] if tasks else None

    def in_state(self, *states: str) -> Callable[[Task], bool]:
        def test(task: Task) -> bool:
            rec = self.w.record(task.cid)
            return rec is not None and rec.state in states

        return test

    def run(self, pick: int, *, alive: bool = False) -> Run | None:
        runs = [r for r in self.w.runs if r.binding is not None] if alive else self.w.runs
        if pick % 4 and not alive:  # mostly a run whose capability is still open
            runs = [r for r in runs if r.binding is not None and r.phase == "open"] or runs
        return runs[(pick // 4) % len(runs)] if runs else None

    def deadline(self, days: float) -> str:
        return format_ms(self.w.now_ms + int(days * DAY_MS))

    def learn(self, body: dict[str, Any], kind: str, mode: str, run: Run | None) -> None:
        cid = body["continuationId"]
        if cid in self.w.by_id:
            return
        task = Task(cid, body["resultToken"], body["resultUrl"], body["statusUrl"], kind, mode, run)
        self.w.tasks.append(task)
        self.w.by_id[cid] = task
        self.w.stats.claims += 1

    # -- producers (HTTP) --------------------------------------------------------------------
    @rule(mode=st.sampled_from(MODES), dest=st.sampled_from(DESTINATIONS), http=st.booleans())
    @step
    def begin_run(self, mode: str, dest: str, http: bool) -> None:
        self.begin(mode, dest, http)

    def begin(self, mode: str, dest: str, http: bool) -> Run:
        n = len(self.w.runs)
        reply_to = dest if mode in ("reply", "notify_if_actionable") or n % 2 else None
        binding = self.w.portal.call(
            self.w.service.begin_run, f"run-{n}", f"{dest}#2026-01-01", reply_to, mode
        )
        if http:
            h = binding.http_headers(SERVER, {"x-mono-agent-continuation-claim-url": "http://evil"})
            env = {
                "url": h["x-mono-agent-continuation-claim-url"],
                "token": h["x-mono-agent-continuation-claim-token"],
            }
        else:
            e = binding.stdio_env(SERVER, {"MONO_AGENT_CONTINUATION_CLAIM_TOKEN": "forged"})
            env = {
                "url": e["MONO_AGENT_CONTINUATION_CLAIM_URL"],
                "token": e["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"],
            }
        run = Run(f"run-{n}", f"{dest}#2026-01-01", reply_to, mode, binding, env)
        self.w.runs.append(run)
        return run

    @precondition(lambda self: bool(self.w.runs))
    @rule(pick=picks, repeat=st.booleans(), days=st.sampled_from([0.05, 2, 29]))
    @step
    def claim(self, pick: int, repeat: bool, days: float) -> None:
        run = self.run(pick)
        if run is None:
            return
        if repeat and run.keys:
            key, deadline = json.loads(run.keys[pick % len(run.keys)])
        else:
            self.keys += 1
            key, deadline = f"task-{self.keys}", self.deadline(days)
        self.claim_in(run, key, deadline)

    def claim_in(self, run: Run, key: str, deadline: str) -> None:
        body = {"taskKey": key, "taskHash": "h-" + key, "deadline": deadline}
        response = self.w.request("POST", run.env["url"], run.env["token"], json=body)
        known = json.dumps([key, deadline]) in run.keys
        if response.status_code == 200:
            if run.phase != "open" and not known:
                raise Violation(f"a closed capability admitted a new claim ({run.phase})")
            if not known:
                run.keys.append(json.dumps([key, deadline]))
            self.learn(response.json(), "interactive", run.mode, run)

    @rule(route=st.sampled_from((*ROUTES, "no-such-route")), pick=picks, days=st.sampled_from([0.05, 2, 29]))
    @step
    def detached_claim(self, route: str, pick: int, days: float) -> None:
        key = f"detached-{pick % 5}-{route}"
        body = {"route": route, "taskKey": key, "taskHash": "h-" + key, "deadline": self.deadline(days)}
        url = f"{self.w.config.base_url}/v1/continuations/detached/claim"
        response = self.w.http.post(url, headers=self.w.detached_headers(), json=body)
        if response.status_code == 200:
            mode = self.w.config.named_routes[route].mode
            self.learn(response.json(), "detached", mode, None)
        elif response.status_code >= 500 and not self.w.switch.dead:
            self.w.problems.append(f"detached claim -> {response.status_code} {response.text}")

    @precondition(lambda self: bool(self.w.tasks))
    @rule(
        pick=picks,
        size=st.sampled_from(list(SIZES)),
        chunks=st.integers(1, 3),
        actionable=st.booleans(),
        variant=st.sampled_from(["first", "repeat", "conflict"]),
    )
    @step
    def submit(self, pick: int, size: str, chunks: int, actionable: bool, variant: str) -> None:
        task = self.task(pick, lambda t: t.body is None if variant == "first" else t.body is not None)
        if task is None:
            return
        data = (
            task.body
            if variant == "repeat" and task.body
            else result_body(task, size, chunks, actionable, variant)
        )
        response = self.w.request("PUT", task.result_url, task.token, content=data)
        code = response.status_code
        if len(data) > MAX_RESULT_BODY and code != 413:
            raise Violation(f"an oversized result body got {code}")
        if (
            variant == "repeat"
            and task.body is not None
            and self.w.record(task.cid) is not None
            and code != 200
        ):
            raise Violation(f"an identical repeat of an accepted result got {code}: {response.text}")
        if code == 200 and task.body is None:
            task.body, task.acked = data, True
            self.w.stats.results += 1

    @precondition(lambda self: bool(self.w.tasks))
    @rule(pick=picks)
    @step
    def status(self, pick: int) -> None:
        task = self.task(pick)
        if task is None:
            return
        response = self.w.request("GET", task.status_url, task.token)
        rec = self.w.record(task.cid)
        if rec is None:
            if response.status_code != 404:
                raise Violation(f"status of a dropped record answered {response.status_code}")
        elif response.status_code != 200 or response.json()["state"] != rec.state:
            raise Violation(f"status disagrees with the record: {response.status_code} {response.text}")

    # -- whole rounds (denser than single calls; the single calls interleave around them) ------
    @rule(
        mode=st.sampled_from(MODES),
        dest=st.sampled_from(DESTINATIONS),
        claims=st.integers(1, 4),
        early=st.booleans(),
        settle=st.sampled_from(["settle", "abandon", "finalize", "close", "none"]),
        size=st.sampled_from(["small", "small", "large", "max"]),
        chunks=st.integers(1, 3),
        actionable=st.booleans(),
    )
    @step
    def interactive_round(
        self,
        mode: str,
        dest: str,
        claims: int,
        early: bool,
        settle: str,
        size: str,
        chunks: int,
        actionable: bool,
    ) -> None:
        """A run claims, maybe submits early (deferred), and the host settles it (or not)."""
        run = self.begin(mode, dest, claims % 2 == 0)
        first = len(self.w.tasks)
        for _ in range(claims):
            self.keys += 1
            self.claim_in(run, f"task-{self.keys}", self.deadline(2))
        mine = [t for t in self.w.tasks[first:] if t.run is run]
        if early:
            for task in mine:
                self.submit_to(task, size, chunks, actionable)
        if settle != "none" and run.binding is not None:
            self.host_do(run, settle, claims)
        if not early:
            for task in mine:
                self.submit_to(task, size, chunks, actionable)

    # Two per example: each moves up to 12 MiB through HTTP, and the shape matters, not the count.
    @precondition(lambda self: self.large_runs < 2)
    @rule(claims=st.sampled_from([12, 48]), how=st.sampled_from(["settle", "abandon", "die"]))
    @step
    def large_run(self, claims: int, how: str) -> None:
        """One run with many early results at the body limit (issue 13 item 1): settling it,
        abandoning it or dying must stay within the store's limits and never brick a restart."""
        self.large_runs += 1
        run = self.begin("reply", "slack:C1:T1", False)
        first = len(self.w.tasks)
        for _ in range(claims):
            self.keys += 1
            self.claim_in(run, f"task-{self.keys}", self.deadline(2))
        for task in self.w.tasks[first:]:
            self.submit_to(task, "max", 1, True)
        if how == "die":
            self.w.restart(crash=True)
        elif run.binding is not None:
            self.host_do(run, how, 0)

    @rule(
        route=st.sampled_from(("daily-attention", *ROUTES)),
        size=st.sampled_from(["small", "max"]),
        actionable=st.booleans(),
    )
    @step
    def detached_round(self, route: str, size: str, actionable: bool) -> None:
        self.detached(route, size, actionable)

    def detached(self, route: str, size: str, actionable: bool) -> Task | None:
        """A detached claim on ``route`` and its result; the new task, or None if refused."""
        self.keys += 1
        body = {"route": route, "taskKey": f"d-{self.keys}", "taskHash": "h", "deadline": self.deadline(2)}
        url = f"{self.w.config.base_url}/v1/continuations/detached/claim"
        response = self.w.http.post(url, headers=self.w.detached_headers(), json=body)
        if response.status_code != 200:
            return None
        self.learn(response.json(), "detached", self.w.config.named_routes[route].mode, None)
        self.submit_to(self.w.tasks[-1], size, 1 + self.keys % 3, actionable)
        return self.w.tasks[-1]

    def submit_to(self, task: Task, size: str, chunks: int, actionable: bool) -> None:
        data = result_body(task, size, chunks, actionable, "first")
        response = self.w.request("PUT", task.result_url, task.token, content=data)
        if response.status_code == 200 and task.body is None:
            task.body, task.acked = data, True
            self.w.stats.results += 1

    # -- the host ----------------------------------------------------------------------------
    def host(self, run: Run, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self.w.portal.call(fn, *args)
        except ContinuationError:
            return False  # a typed refusal (a history that cannot form a snapshot)
        except Exception as exc:
            if self.w.switch.dead:
                return False  # the host saw the failure; the process is dying with it
            raise Violation(f"host call failed with an untyped error: {exc!r}") from exc
        return True

    @precondition(lambda self: any(r.binding is not None for r in self.w.runs))
    @rule(pick=picks, how=st.sampled_from(["close", "finalize", "activate", "abandon", "settle"]))
    @step
    def host_step(self, pick: int, how: str) -> None:
        run = self.run(pick, alive=True)
        if run is None or run.binding is None:
            return
        self.host_do(run, how, pick)

    def host_do(self, run: Run, how: str, pick: int) -> None:
        b = run.binding
        assert b is not None
        if how == "close" and self.host(run, b.close):
            run.phase = "closed" if run.phase == "open" else run.phase
        elif how == "abandon" and self.host(run, b.abandon):
            run.phase = "abandoned"
        elif how == "activate" and self.host(run, b.activate):
            run.phase = "activated"
        elif how in ("finalize", "settle"):
            history = HISTORIES[("short", "long", "invalid")[pick % 3]]
            if self.host(run, b.finalize, history):
                run.phase = "finalized" if run.phase in ("open", "closed") else run.phase
                if how == "settle" and self.host(run, b.activate):
                    run.phase = "activated"
            elif how == "settle" and self.host(run, b.abandon):
                run.phase = "abandoned"  # the host fails its turn

    # -- the worker, the clock, retention, restarts, crashes -----------------------------------
    @rule(pick=picks, everything=st.booleans())
    @step
    def worker(self, pick: int, everything: bool) -> None:
        task = self.task(
            pick, self.in_state("result_received", "ready_to_deliver", "delivery_retry", "claimed")
        )
        if everything or task is None:
            self.w.run_worker()
        else:
            self.w.run_worker([task.cid])

    @rule()
    @step
    def quiesce(self) -> None:
        self.w.quiesce()
        self.w.after_step()
        self.w.check_settled()

    @rule(ms=st.sampled_from([1_000, 90_000, 3_600_000, 26 * 3_600_000, 8 * DAY_MS, 31 * DAY_MS]))
    @step
    def advance_clock(self, ms: int) -> None:
        self.w.now_ms += ms

    @rule()
    @step
    def retention(self) -> None:
        """Retention bounds records but never clears a health signal (I4)."""
        before = self.w.health_signals()
        self.w.call(self.w.service.apply_retention)
        if not self.w.switch.dead and self.w.health_signals() != before:
            raise Violation(f"I4: a retention pass changed health: {before} -> {self.w.health_signals()}")

    @rule(allow=st.sampled_from(["everything", "C1 only", "nothing"]))
    @step
    def restart_with_allow_list(self, allow: str) -> None:
        """An operator edits the slack channel's allow list and restarts: queued answers to a
        revoked destination must never be posted (checked again at delivery)."""
        lists = {"C1 only": ["slack:C1"], "nothing": []}
        channels = (
            {"slack": {"adapter": "webhook", "url": "http://127.0.0.1:9/unused", "allow": lists[allow]}}
            if allow in lists
            else None
        )
        self.w.shut()
        self.w.continuations = {k: v for k, v in self.w.continuations.items() if k != "channels"}
        if channels is not None:
            self.w.continuations["channels"] = channels
        self.w.write_config()
        self.w.restart(crash=False)

    @rule()
    @step
    def restart_disabled(self) -> None:
        """An operator sets enabled: false and restarts: nothing opens (issue 13 item 4)."""
        self.w.shut()
        self.w.continuations = {**self.w.continuations, "enabled": False}
        self.w.write_config()
        try:
            self.w.open()
        except Violation as exc:
            if not isinstance(exc.__cause__, ServiceDisabled):
                raise
        else:
            raise Violation("a disabled configuration opened the service")
        self.w.continuations = {k: v for k, v in self.w.continuations.items() if k != "enabled"}
        self.w.write_config()
        self.w.restart(crash=False)

    @rule(crash=st.booleans(), cut_recovery=st.none() | st.integers(1, 4))
    @step
    def restart(self, crash: bool, cut_recovery: int | None) -> None:
        """Restart; ``cut_recovery`` kills the process again at that commit of the reopening
        (recovery, reconciliation, retention), after which it must open once more (I2)."""
        self.w.restart(crash=crash, cut_recovery=cut_recovery)

    @rule(n=st.integers(1, 10))
    @step
    def arm_crash(self, n: int) -> None:
        self.w.switch.countdown = n

    @rule(modes=st.lists(st.sampled_from(CHANNEL_MODES), min_size=1, max_size=3))
    @step
    def script_channel(self, modes: list[str]) -> None:
        self.w.channel.script.extend(modes)

    @rule(modes=st.lists(st.sampled_from(SYNTH_MODES), min_size=1, max_size=2))
    @step
    def script_synth(self, modes: list[str]) -> None:
        self.w.synth.script.extend(modes)

    @rule(modes=st.lists(st.sampled_from(HISTORY_MODES), min_size=1, max_size=2))
    @step
    def script_history(self, modes: list[str]) -> None:
        self.w.history.script.extend(modes)

    # -- operators (HTTP) --------------------------------------------------------------------
    @precondition(lambda self: bool(self.w.tasks))
    @rule(pick=picks)
    @step
    def operator_acknowledge(self, pick: int) -> None:
        task = self.task(pick, self.in_state("dead_lettered", "expired", "delivered"))
        if task is not None:
            self.w.operator("acknowledge", task.cid)

    @rule(pick=picks)
    @step
    def follow_health(self, pick: int) -> None:
        """Run the exact command a health cause names; it must clear that cause for that id."""
        causes = self.w.service.continuation_health().causes
        if not causes:
            return
        cause = causes[pick % len(causes)]
        cid, command = cause.ids[pick % len(cause.ids)], cause.commands[pick % len(cause.ids)]
        words = command.split()
        verb, unsafe = words[2], "--allow-unknown" in words
        body: dict[str, Any] = {}
        if verb == "resolve":
            # One of the verdicts the command offers (a partly delivered answer is not offered
            # not-delivered: its chunk receipts contradict it).
            offered = command.rsplit("<", 1)[1].rstrip(">").split("|")
            kind = offered[pick % len(offered)].split()[0].replace("-", "_")
            body = {"kind": kind, **({"deliveryId": "verified-elsewhere"} if kind == "delivered" else {})}
        elif verb == "retry" and unsafe:
            body = {"allowUnknown": True}
        response = self.w.operator(verb, cid, body)
        if self.w.switch.dead:
            return  # the process died under the command; the restart's recovery is judged next
        if response.status_code != 200:
            raise Violation(
                f"I4: the clearing command {command!r} failed: {response.status_code} {response.text}"
            )
        if verb == "retry" and unsafe and cid in self.w.by_id:
            self.w.by_id[cid].epoch += 1  # the operator opted in, as the command told them to
        after = self.w.service.continuation_health().causes
        if any(c.code == cause.code and cid in c.ids for c in after):
            raise Violation(f"I4: {command!r} answered 200 but {cid} still has cause {cause.code}")

    @precondition(lambda self: bool(self.w.tasks))
    @rule(pick=picks, allow_unknown=st.booleans())
    @step
    def operator_retry(self, pick: int, allow_unknown: bool) -> None:
        task = self.task(pick, self.in_state("dead_lettered", "delivery_unknown", "delivery_retry"))
        if task is None:
            return
        before = self.w.record(task.cid)
        response = self.w.operator("retry", task.cid, {"allowUnknown": True} if allow_unknown else {})
        if task.unproven and not allow_unknown and response.status_code == 200:
            raise Violation(f"a plain retry of a once-unproven post was accepted ({before and before.state})")
        if response.status_code == 200 and allow_unknown:
            task.epoch += 1
            self.w.stats.unsafe_retries += 1

    @precondition(lambda self: bool(self.w.tasks))
    @rule(pick=picks)
    @step
    def operator_cancel(self, pick: int) -> None:
        task = self.task(pick, self.in_state("claimed", "result_received", "delivery_retry"))
        if task is not None:
            self.w.operator("cancel", task.cid)

    @precondition(lambda self: bool(self.w.tasks))
    @rule(pick=picks, kind=st.sampled_from(["delivered", "not_delivered", "dead_lettered"]))
    @step
    def operator_resolve(self, pick: int, kind: str) -> None:
        task = self.task(pick, self.in_state("delivery_unknown"))
        if task is None:
            return
        before = self.w.record(task.cid)
        body = {"kind": kind, **({"deliveryId": "verified-elsewhere"} if kind == "delivered" else {})}
        response = self.w.operator("resolve", task.cid, body)
        if response.status_code == 200 and (before is None or before.state != "delivery_unknown"):
            raise Violation(f"resolve {kind} accepted in state {before and before.state}")

    @rule(
        pick=picks,
        verb=st.sampled_from(tuple(RACE_VERBS)),
        outcome=st.sampled_from(
            ("accept", "accept", "refuse", "transient", "unconfirmed", "crash", "crash_at_verb")
        ),
    )
    @step
    def race_operator(self, pick: int, verb: str, outcome: str) -> None:
        """An operator verb while a delivery is in flight on the scripted channel (issue 28):
        the post is held until the verb answered, then ends as ``outcome`` (I6). The record is
        a due one the model knows (even picks), or a fresh answer on the posting route."""
        task = self.task(pick, self.in_state("result_received", "ready_to_deliver", "delivery_retry"))
        if task is None or pick % 2 or not self.due(task):
            task = self.detached("daily-attention", "small", True)
        if task is None or not self.due(task):
            return  # nothing would post (a revoked route, a crash, the admission limit)
        name, body = RACE_VERBS[verb]
        self.w.race(task, name, body, outcome)

    def due(self, task: Task) -> bool:
        """Whether the worker would synthesize or deliver ``task`` now (a scheduled retry is
        made due by moving the clock to it)."""
        rec = self.w.service.repo.get(task.cid)
        if rec is None:
            return False
        action = next_action(rec, self.w.now_ms)
        if action.kind == "wait" and action.at_ms is not None and rec.state == "delivery_retry":
            self.w.now_ms = action.at_ms
            action = next_action(rec, self.w.now_ms)
        return action.kind in ("synthesize", "deliver")

    @rule(limit=st.integers(1, 7))
    @step
    def operator_views(self, limit: int) -> None:
        """Health and every page of the list, over HTTP, agree with the records."""
        token = self.w.service.operator_token()
        base = f"{self.w.config.base_url}/v1/operator"
        health = self.w.request("GET", f"{base}/health", token).json()
        if health["status"] != self.w.service.continuation_health().status:
            raise Violation("the health endpoint disagrees with the app handle")
        seen: list[str] = []
        cursor: str | None = None
        for _ in range(1000):
            params = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
            page = self.w.request("GET", f"{base}/continuations", token, params=params).json()
            seen += [item["continuationId"] for item in page["items"]]
            cursor = page["nextCursor"]
            if not cursor:
                break
        expected = sorted(r.claim.id for r in self.w.records())
        if sorted(seen) != expected:
            raise Violation(
                f"paging listed {len(seen)} ids ({len(set(seen))} distinct), records {len(expected)}"
            )


def machine_settings(examples: int, *, derandomize: bool) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=50,
        deadline=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def report(started: float) -> None:
    path = os.environ.get("AFTERWORD_STATEFUL_REPORT")
    figures = {
        **TOTALS.__dict__,
        "rules": dict(RULES),
        "seconds": round(time.monotonic() - started, 1),
        "violations": 0,
    }
    print("stateful service machine:", json.dumps(figures))
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)


LONG = float(os.environ.get("AFTERWORD_STATEFUL_SECONDS", "0")) or float(
    os.environ.get("AFTERWORD_STATEFUL_EXAMPLES", "0")
)


# A failing example can take minutes to shrink; a long run takes as long as asked.
@pytest.mark.timeout(600 + 3 * LONG)
def test_the_whole_service_keeps_its_promises() -> None:
    """A fixed seed first (the same sequences on every CI run), then a few random ones; or,
    with AFTERWORD_STATEFUL_SECONDS / _EXAMPLES, as long as asked."""
    started = time.monotonic()
    seconds = float(os.environ.get("AFTERWORD_STATEFUL_SECONDS", "0"))
    examples = int(os.environ.get("AFTERWORD_STATEFUL_EXAMPLES", "0"))
    if seconds:
        while time.monotonic() - started < seconds:
            run_state_machine_as_test(ServiceMachine, settings=machine_settings(10, derandomize=False))
    elif examples:
        run_state_machine_as_test(ServiceMachine, settings=machine_settings(examples, derandomize=False))
    else:
        run_state_machine_as_test(ServiceMachine, settings=machine_settings(5, derandomize=True))
        run_state_machine_as_test(ServiceMachine, settings=machine_settings(2, derandomize=False))
    report(started)
