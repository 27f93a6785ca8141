"""Acknowledge, compaction and what health recommends (issue 28, point 2).

Health offers the step that keeps every option open first (``show``, then ``retry`` for a dead
letter) and ``acknowledge`` only as the alternative, saying what it gives up; a verb on a record
retention compacted answers ``compacted`` (410), not ``not_found``; and compaction is reported
apart from the origin context in the list, ``show``, JSON and the status page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from _cli import run_cli, run_printed, served, write_operator_config
from fakes import FakeWebhook, Reply
from fakes.harness import make_config, running
from fakes.producer import reply_run, wait_state

from afterword.cli.render import print_detail, print_page

pytestmark = pytest.mark.anyio


async def operator(service: Any, method: str, path: str, body: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.request(
            method,
            service.base_url + "/v1/operator/continuations" + path,
            headers={"Authorization": "Bearer " + service.operator_token()},
            json=body,
        )


async def test_a_dead_letter_is_offered_show_and_retry_before_acknowledge(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        fake.script(Reply(status=400))
        block = {
            "channels": {"hook": {"adapter": "webhook", "url": fake.url + "/d"}, "*": {"adapter": "outbox"}}
        }
        config, env = make_config(tmp_path, block)
        async with running(config, env) as h:
            svc = h.service
            claimed = await reply_run(svc, h.producer, {"summary": "x"}, reply_to="hook:a")
            assert (await wait_state(svc, claimed.id)).state == "dead_lettered"
            r = await operator(svc, "GET", "/../health")
            (cause,) = [c for c in r.json()["causes"] if c["code"] == "dead_lettered"]
            base = f"afterword continuations {{}} --config {config.config_path} {claimed.id}"
            assert cause["inspect"] == [base.format("show")]
            assert cause["commands"] == [base.format("retry")]  # reversible, and it clears the cause
            assert cause["alternatives"] == [base.format("acknowledge")]
            assert (
                "compacts" in cause["alternativeNote"] and "no longer be retried" in cause["alternativeNote"]
            )
            # The offered retry is accepted and clears the cause (the answer goes out again).
            r = await operator(svc, "POST", f"/{claimed.id}/retry")
            assert r.status_code == 200, r.text
            assert (await wait_state(svc, claimed.id)).state == "delivered"


async def test_a_dead_letter_that_cannot_be_retried_is_offered_acknowledge(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        fake.script(Reply(status=400))
        block = {
            "channels": {"hook": {"adapter": "webhook", "url": fake.url + "/d"}, "*": {"adapter": "outbox"}}
        }
        config, env = make_config(tmp_path, block)
        async with running(config, env) as h:
            svc = h.service
            claimed = await reply_run(svc, h.producer, {"summary": "x"}, reply_to="hook:a")
            rec = await wait_state(svc, claimed.id)
            # A dead letter whose earlier post was never proven: a plain retry is refused.
            await svc.commit([(rec, msgspec.structs.replace(rec, post_unproven=True))])
            (cause,) = [c for c in svc.continuation_health().causes if c.code == "dead_lettered"]
            assert cause.commands == [
                f"afterword continuations acknowledge --config {config.config_path} {claimed.id}"
            ]
            assert cause.alternatives == [""]


async def test_a_verb_on_a_compacted_record_says_compacted(tmp_path: Path, capsys: Any) -> None:
    with FakeWebhook() as fake:
        fake.script(Reply(status=400))
        block = {
            "channels": {"hook": {"adapter": "webhook", "url": fake.url + "/d"}, "*": {"adapter": "outbox"}}
        }
        config, env = make_config(tmp_path, block)
        async with running(config, env) as h:
            svc = h.service
            claimed = await reply_run(svc, h.producer, {"summary": "x"}, reply_to="hook:a")
            await wait_state(svc, claimed.id)
            await svc.acknowledge_continuation(claimed.id)
            compacted, _, _ = await svc.apply_retention()
            assert compacted == 1 and svc.repo.get(claimed.id) is None
            answers = {
                verb: await operator(
                    svc,
                    "POST",
                    f"/{claimed.id}/{verb}",
                    {"kind": "dead_lettered"} if verb == "resolve" else {},
                )
                for verb in ("retry", "cancel", "resolve")
            }
            shown = await operator(svc, "GET", f"/{claimed.id}")
            listed = await operator(svc, "GET", "")
            page = svc.list_continuations()
            detail = svc.continuation_detail(claimed.id)
            unknown = await operator(svc, "POST", "/c_never/retry")
    for verb, r in answers.items():
        assert r.status_code == 410, (verb, r.text)
        error = r.json()["error"]
        assert error["code"] == "compacted"
        assert (
            "compacted" in error["message"]
            and "payload" in error["message"]
            and claimed.id in error["message"]
        )
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    # show and list still report it: compacted, its snapshot scrubbed, with the origin context
    # it had beside that
    status = shown.json()["status"]
    assert (
        status["compacted"] is True
        and status["originContext"] == "scrubbed"
        and status["originContextAtCompaction"] == "pinned"
        and status["state"] == "dead_lettered"
    )
    (item,) = listed.json()["items"]
    assert item["compacted"] is True and item["originContextAtCompaction"] == "pinned"
    print_page(page, None)
    table = capsys.readouterr().out
    header, row = table.splitlines()[:2]
    assert "COMPACTED" in header and "ORIGIN" in header
    assert "scrubbed" not in row and "pinned" in row and "yes" in row
    print_detail(detail)
    shown_text = capsys.readouterr().out
    assert (
        "origin context   pinned" in shown_text
        or "pinned" in shown_text.split("origin context")[1].splitlines()[0]
    )
    assert "compacted" in shown_text and "snapshot scrubbed by compaction" in shown_text


def test_acknowledge_says_what_it_gives_up(tmp_path: Path) -> None:
    help_text = run_cli("continuations", "acknowledge", "-h").stdout
    flat = " ".join(help_text.split())
    assert "no longer be retried" in flat and "compacts" in flat and "retry ID" in flat
    with FakeWebhook() as fake:
        fake.always(Reply(status=400))
        config = write_operator_config(tmp_path, fake.url + "/hook")
        with served(config) as server:
            claim = server.claim("ok", "t-ack")
            server.result(claim, {"summary": "x"})
            server.wait_state(claim, "dead_lettered")
            cid = claim["continuationId"]
            health = run_cli("continuations", "health", config=config)
            lines = [line.strip() for line in health.stdout.splitlines()]
            show_at = next(
                i for i, line in enumerate(lines) if line.startswith("afterword continuations show")
            )
            assert lines[show_at + 1].startswith("afterword continuations retry")
            assert lines[show_at + 2].startswith("or, to give it up: afterword continuations acknowledge")
            assert "no longer be retried" in health.stdout
            assert run_printed(lines[show_at]).returncode == 0  # the printed commands run as printed
            done = run_cli("continuations", "acknowledge", cid, config=config)
            assert done.returncode == 0, done.stderr
            assert f"{cid}: acknowledged dead_lettered" in done.stdout
            assert "no longer be retried" in done.stdout and "compacts" in done.stdout
            as_json = run_cli("continuations", "acknowledge", cid, "--json", config=config)
            assert json.loads(as_json.stdout)["acknowledgedAt"] is not None
