"""Health as a pure function of the current records.

Every non-healthy verdict has causes, and every cause is a fact about named records that an
operator can change with one command:

=====================  ==========  ==========================================================
cause                  health      cleared by
=====================  ==========  ==========================================================
``delivery_unknown``   unhealthy   ``resolve ID delivered DELIVERY_ID|not-delivered|dead-lettered``
``task_lost``          unhealthy   ``acknowledge ID`` (an MCP server lost the task: a dead letter
                                   nothing can retry)
``dead_lettered``      unhealthy   ``retry ID`` where a retry is accepted, else ``acknowledge ID``
``expired``            degraded    ``acknowledge ID``
``history_unrecorded`` degraded    ``acknowledge ID`` (a delivered answer missing from history)
``held``               degraded    ``retry ID`` (delivery waits for an operator)
``pending``            degraded    finishes by itself, or ``cancel ID``
=====================  ==========  ==========================================================

Where the operator has to decide after looking (an unknown delivery, a dead letter), the cause
also names ``show ID`` to run first. Health offers the step that keeps every option open first:
a dead letter's command is ``retry`` whenever the core would accept it, and ``acknowledge``,
which gives the record up to retention (its payload and answer are then dropped and it can no
longer be retried), is offered as the alternative with what it gives up.

A record keeps its cause after compaction (tombstones carry the receipt and the
acknowledgement), so retention never clears a signal; an acknowledgement does, and only an
acknowledged or otherwise settled record is subject to retention.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from .guards import retry_refusal
from .model import Continuation, Tombstone, TombstoneSummary
from .transitions import flags

Health = Literal["healthy", "degraded", "unhealthy"]
# Each verdict as a number, worse is larger: `afterword continuations health` exits with it and
# the afterword_health gauge reports it (docs/design.md, Contracts: command line).
SEVERITY: dict[str, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2}
ACTIVE = frozenset({"claimed", "result_received", "synthesizing", "ready_to_deliver", "delivery_retry"})
CauseCode = Literal[
    "delivery_unknown", "task_lost", "dead_lettered", "expired", "history_unrecorded", "held", "pending"
]

# cause -> (health, operator verb, what follows the id, explanation)
CAUSES: dict[str, tuple[Health, str, str, str]] = {
    "delivery_unknown": (
        "unhealthy",
        "resolve",
        " <delivered DELIVERY_ID|not-delivered|dead-lettered>",
        "delivery outcome unknown: verify externally, then resolve with the verdict",
    ),
    "task_lost": (
        "unhealthy",
        "acknowledge",
        "",
        "the MCP server no longer knows this task (it lost its state): its result can never be "
        "fetched; tell the user if needed, then acknowledge it",
    ),
    "dead_lettered": (
        "unhealthy",
        "retry",
        "",
        "dead-lettered: inspect it, then retry it; acknowledge it only to give it up",
    ),
    "expired": ("degraded", "acknowledge", "", "expired before a result arrived"),
    "history_unrecorded": (
        "degraded",
        "acknowledge",
        "",
        "delivered, but the answer could not be appended to conversation history",
    ),
    "held": ("degraded", "retry", "", "delivery is held for an operator retry"),
    "pending": ("degraded", "cancel", "", "work in progress: clears when it finishes, or cancel it"),
}
ORDER: tuple[str, ...] = tuple(CAUSES)
# Causes an acknowledgement clears; the others need a different verb.
ACKNOWLEDGEABLE = frozenset({"task_lost", "dead_lettered", "expired", "history_unrecorded"})
# Causes whose clearing command is a choice made after looking: ``show ID`` comes first.
INSPECT_FIRST = frozenset({"delivery_unknown", "task_lost", "dead_lettered"})
ACKNOWLEDGE_GIVES_UP = (
    "acknowledging gives the record up: it stops counting against health and retention compacts "
    "it at its next pass, dropping its payload and answer, after which it can no longer be "
    "retried (show and list keep its outcome)"
)


def acknowledge_consequence(state: str) -> str:
    """What acknowledging a record in ``state`` gives up, for the operator who just did it."""
    if state == "dead_lettered":
        return ACKNOWLEDGE_GIVES_UP
    if state == "expired":
        return (
            "it stops counting against health; retention compacts it at its next pass and drops "
            "it once older than the tombstone retention (no result was ever accepted for it)"
        )
    if state == "delivered":
        return (
            "the delivered answer stays missing from the conversation history and health stops "
            "reporting it; nothing is posted again"
        )
    return "it stops counting against health"


def attention(rec: Continuation | Tombstone) -> str | None:
    """The cause this record contributes to health, or None when nobody needs to act."""
    if rec.state == "delivery_unknown":
        return "delivery_unknown"
    if isinstance(rec, Continuation) and rec.state in ACTIVE:
        if rec.state == "delivery_retry" and "held" in flags(rec):
            return "held"
        return "pending"
    if rec.acknowledged_at_ms is not None:
        return None
    if rec.state == "dead_lettered":
        # A task its server lost is named apart: nothing can retry it, only the user be told.
        lost = rec.last_error is not None and rec.last_error.code == "task_lost"
        return "task_lost" if lost else "dead_lettered"
    if rec.state == "expired":
        return "expired"
    if rec.state == "delivered" and rec.receipt is not None and not rec.receipt.history_recorded:
        return "history_unrecorded"
    return None


def cause_of(rec: Continuation | Tombstone | TombstoneSummary) -> str | None:
    """:func:`attention` of a record, or the cause its tombstone's summary carries."""
    return rec.cause if isinstance(rec, TombstoneSummary) else attention(rec)


def ident(rec: Continuation | Tombstone | TombstoneSummary) -> str:
    return rec.id if isinstance(rec, TombstoneSummary) else rec.claim.id


@dataclass(frozen=True)
class Cause:
    code: str
    status: Health
    count: int
    ids: tuple[str, ...]  # the first ``id_limit`` ids, sorted
    message: str
    commands: tuple[str, ...]  # the exact operator command clearing it, one per listed id
    inspect: tuple[str, ...] = ()  # ``show ID`` per listed id, to run before a choice
    alternatives: tuple[str, ...] = ()  # per listed id: the command that gives it up ("" if none)
    alternative_note: str | None = None  # what the alternatives give up


def dead_letter_command(rec: Continuation | Tombstone | TombstoneSummary) -> str:
    """The verb health offers for a dead letter: retry when the core would accept a plain
    retry (nothing is lost), else acknowledge (the one verb left)."""
    if isinstance(rec, Continuation) and retry_refusal(rec, allow_unknown=False) is None:
        return "retry"
    return "acknowledge"


NOT_RETRYABLE = (
    "dead-lettered and cannot be retried (a task its server can no longer answer, or nothing "
    "left to post): inspect it, tell the user if needed, then acknowledge it"
)
SOME_RETRYABLE = (
    "dead-lettered: inspect each, then run its command (retry where the core accepts one, "
    "acknowledge where it cannot be retried)"
)


def dead_letter_message(verbs: Iterable[str | None]) -> str:
    """The explanation of the listed dead letters: it offers ``retry`` only when a retry of
    each would be accepted, so it never contradicts the commands beside it."""
    offered = set(verbs)
    if offered == {"retry"}:
        return CAUSES["dead_lettered"][3]
    return NOT_RETRYABLE if offered == {"acknowledge"} else SOME_RETRYABLE


# The verdicts a partly delivered answer can still get: some chunks have channel receipts, so
# "not delivered" would contradict them (transitions.OPERATOR_REFUSALS).
PARTIAL_RESOLVE_TAIL = " <delivered DELIVERY_ID|dead-lettered>"


def clearing_command(
    code: str,
    cid: str,
    config_path: str | None = None,
    *,
    unsafe: bool = False,
    verb: str | None = None,
    tail: str | None = None,
) -> str:
    """``unsafe``: a held record whose earlier post was never proven can be posted only with
    the explicit opt-in the operator already chose by resolving it as not delivered. ``verb``
    overrides the cause's verb (a dead letter that cannot be retried is acknowledged)."""
    _, default_verb, default_tail, _ = CAUSES[code]
    verb = verb or default_verb
    if tail is None:
        tail = default_tail if verb == default_verb else ""
    config = f" --config {shlex.quote(config_path)}" if config_path else ""
    opt_in = " --allow-unknown" if unsafe else ""
    return f"afterword continuations {verb}{config} {shlex.quote(cid)}{opt_in}{tail}"


def command_for(verb: str, cid: str, config_path: str | None) -> str:
    config = f" --config {shlex.quote(config_path)}" if config_path else ""
    return f"afterword continuations {verb}{config} {shlex.quote(cid)}"


@dataclass(frozen=True)
class HealthReport:
    status: Health
    counts: Mapping[str, int]
    history_unrecorded: int
    active: int
    causes: tuple[Cause, ...]


def assess(
    live: Iterable[Continuation],
    tombstones: Iterable[Tombstone | TombstoneSummary],
    *,
    id_limit: int = 100,
    config_path: str | None = None,
) -> HealthReport:
    """Health of a set of records: unhealthy beats degraded beats healthy. ``config_path``
    goes into the clearing commands so they address the same service."""
    counts: Counter[str] = Counter()
    found: dict[str, list[Continuation | Tombstone | TombstoneSummary]] = {code: [] for code in CAUSES}
    records: list[Continuation | Tombstone | TombstoneSummary] = [*live, *tombstones]
    for rec in records:
        counts[rec.state] += 1
        code = cause_of(rec)
        if code is not None:
            found[code].append(rec)
    causes = []
    for code in ORDER:
        if found[code]:
            level, _, _, message = CAUSES[code]
            listed = sorted(found[code], key=ident)[:id_limit]
            verbs = [dead_letter_command(r) if code == "dead_lettered" else None for r in listed]
            commands = tuple(
                clearing_command(
                    code,
                    ident(r),
                    config_path,
                    unsafe=code == "held" and isinstance(r, Continuation) and r.post_unproven,
                    verb=verb,
                    tail=PARTIAL_RESOLVE_TAIL
                    if code == "delivery_unknown" and isinstance(r, Continuation) and r.chunk_receipts
                    else None,
                )
                for r, verb in zip(listed, verbs, strict=True)
            )
            ids = tuple(ident(r) for r in listed)
            inspect = (
                tuple(command_for("show", cid, config_path) for cid in ids) if code in INSPECT_FIRST else ()
            )
            alternatives: tuple[str, ...] = ()
            note = None
            if code == "dead_lettered":
                alternatives = tuple(
                    command_for("acknowledge", cid, config_path) if verb == "retry" else ""
                    for cid, verb in zip(ids, verbs, strict=True)
                )
                note = ACKNOWLEDGE_GIVES_UP
                message = dead_letter_message(verbs)
            causes.append(
                Cause(code, level, len(found[code]), ids, message, commands, inspect, alternatives, note)
            )
    status: Health = "healthy"
    if any(c.status == "unhealthy" for c in causes):
        status = "unhealthy"
    elif causes:
        status = "degraded"
    return HealthReport(
        status=status,
        counts={k: v for k, v in counts.items() if v > 0},
        history_unrecorded=len(found["history_unrecorded"]),
        active=sum(counts[s] for s in ACTIVE),
        causes=tuple(causes),
    )
