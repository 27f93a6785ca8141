"""What an operator reads on a terminal: the health summary, the list table and one
continuation's page. Only the text form lives here; ``--json`` prints the wire bodies as they
are (:mod:`afterword.protocol.wire`). Nothing here ever prints a token, payload or answer."""

from __future__ import annotations

from ..protocol.wire import DetailBody, HealthBody, ListResponse


def print_health(health: HealthBody) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(health.counts.items())) or "no continuations"
    extra = f"; {health.history_unrecorded} delivered without history" if health.history_unrecorded else ""
    print(f"{health.status}: {counts}{extra}")
    for cause in health.causes:
        print(f"  {cause.code} ({cause.status}): {cause.count} - {cause.message}")
        for index, command in enumerate(cause.commands):
            # Look first, then the step that keeps every option open; the one that gives the
            # record up comes last, marked as such.
            if index < len(cause.inspect):
                print(f"    {cause.inspect[index]}")
            print(f"    {command}")
            if index < len(cause.alternatives) and cause.alternatives[index]:
                print(f"    or, to give it up: {cause.alternatives[index]}")
        if cause.alternative_note and any(cause.alternatives):
            print(f"    ({cause.alternative_note})")
        if cause.count > len(cause.ids):
            print(f"    ... and {cause.count - len(cause.ids)} more (afterword continuations list)")


def print_page(page: ListResponse, next_command: str | None) -> None:
    """One page of ``continuations list``; ``next_command`` fetches the next page, if any."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    columns = (
        "ID",
        "STATE",
        "OUTCOME",
        "ORIGIN",
        "COMPACTED",
        "MODE",
        "SERVER",
        "ATTEMPTS",
        "UPDATED",
        "LAST ERROR",
    )
    for col in columns:
        table.add_column(col, no_wrap=col != "LAST ERROR")
    for item in page.items:
        table.add_row(
            item.continuation_id,
            # Sticky warning: posting it again needs retry --allow-unknown.
            state_label(item.state, item.held, item.next_attempt_at, item.in_flight)
            + (" (unproven post)" if item.post_unproven else "")
            + (" (acknowledged)" if item.acknowledged_at else ""),
            item.outcome or "",
            # A compacted record shows the origin it had; COMPACTED says the snapshot is gone.
            item.origin_context_at_compaction or item.origin_context,
            # Retention's doing, not the origin's: payload and answer dropped, outcome kept.
            "yes" if item.compacted else "",
            item.mode,
            item.server_name + (f" ({item.route})" if item.route else ""),
            f"{item.attempts.synthesis}/{item.attempts.delivery}",
            item.updated_at,
            item.last_error.code if item.last_error else "",
        )
    console = Console(width=200, highlight=False, soft_wrap=True)
    if page.items:
        console.print(table)
    else:
        console.print("no continuations")
    if next_command:
        console.print(f"more records remain; next page:\n  {next_command}")


def state_label(state: str, held: bool, next_attempt_at: str | None, in_flight: bool = False) -> str:
    # A held retry waits for an operator; a scheduled one will run by itself; a post in flight
    # refuses every operator verb until it ends.
    if in_flight:
        return f"{state} (posting)"
    if held:
        return f"{state} (held)"
    if next_attempt_at:
        return f"{state} (next {next_attempt_at})"
    return state


def print_detail(detail: DetailBody) -> None:
    st = detail.status
    rows: list[tuple[str, str]] = [
        ("id", st.continuation_id),
        ("state", state_label(st.state, st.held, st.next_attempt_at, st.in_flight)),
        ("outcome", st.outcome or "-"),
        ("completion kind", st.completion_kind or "-"),
        ("kind / mode", f"{st.kind} / {st.mode}"),
        (
            "origin context",
            f"{st.origin_context_at_compaction} (snapshot scrubbed by compaction)"
            if st.origin_context_at_compaction
            else st.origin_context,
        ),
        ("server", detail.server_name + (f" (route {detail.route})" if detail.route else "")),
        ("task key", detail.task_key),
        ("attempts", f"synthesis {st.attempts.synthesis}, delivery {st.attempts.delivery} (all rounds)"),
        ("last error", f"{st.last_error.code}: {st.last_error.message}" if st.last_error else "-"),
        ("created", st.created_at),
        ("updated", st.updated_at),
        ("expires", st.expires_at),
        ("deferred", "yes (waiting for the origin run to settle)" if st.deferred else "no"),
    ]
    rows.append(
        (
            "compacted",
            "yes: retention dropped its payload and answer; the outcome, receipt and history remain, "
            "and retry, cancel and resolve no longer apply"
            if st.compacted
            else "no",
        )
    )
    task = detail.task
    if task is not None:
        cancel = task.cancel or "-"
        if task.cancel_detail:
            cancel += f" ({task.cancel_detail})"
        rows += [
            ("mcp task", f"{task.task_id} on {task.server}, followed by the {task.follow}"),
            ("  last status", task.status + (f" (reported {task.reported_at})" if task.reported_at else "")),
            ("  tasks/cancel", cancel),
        ]
    receipt = st.receipt
    if receipt is not None:
        rows += [
            ("receipt", f"{receipt.kind} at {receipt.delivered_at}"),
            ("  channel", receipt.channel_id or "-"),
            ("  delivery ids", ", ".join(receipt.delivery_ids) or "-"),
            (
                "  history recorded",
                "yes" if receipt.history_recorded else f"no ({receipt.history_error_code or 'unknown'})",
            ),
        ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    print("history" + ("" if detail.history_complete else " (earlier entries not kept)") + ":")
    for h in detail.history:
        print(f"  {h.at}  {h.state}" + (f"  ({h.error})" if h.error else ""))
