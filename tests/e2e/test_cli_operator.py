"""`afterword serve` and the operator CLI, both as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from _cli import FakeWebhook, Server, cli, run_cli, run_printed, served, write_operator_config

pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
def test_health_exit_codes_and_operator_verbs(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config) as server:
        code, out, _ = cli(server, "continuations", "health")
        assert (code, out.strip()) == (0, "healthy: no continuations")

        # pending work -> degraded (1)
        ok = server.claim("ok", "task-ok")
        code, out, _ = cli(server, "continuations", "health")
        assert code == 1 and out.startswith("degraded")
        server.result(ok, {"summary": "all good"})
        server.wait_state(ok, "delivered")
        assert cli(server, "continuations", "health")[0] == 0

        # permanent refusal -> dead_lettered -> unhealthy (2)
        refused = server.claim("refuse", "task-refuse")
        server.result(refused, {"summary": "x"})
        server.wait_state(refused, "dead_lettered")
        code, out, _ = cli(server, "continuations", "health", "--json")
        assert code == 2 and json.loads(out)["status"] == "unhealthy"

        # cancel preserves other terminal states; retry of a dead letter is allowed
        code, _, err = cli(server, "continuations", "cancel", refused["continuationId"])
        assert code == 1 and "not allowed in state dead_lettered" in err
        assert server.status(refused)["state"] == "dead_lettered"
        code, out, _ = cli(server, "continuations", "retry", refused["continuationId"])
        assert code == 0 and out.strip().endswith("delivery_retry")
        st = server.wait_state(refused, "dead_lettered")
        # attempts are cumulative across the operator retry: they match the posts made
        assert hook.count(":refuse") == 2 and st["attempts"]["delivery"] == 2

        # delivery timeout -> delivery_unknown, which a normal retry refuses
        hung = server.claim("hang", "task-hang")
        server.result(hung, {"summary": "y"})
        st = server.wait_state(hung, "delivery_unknown")
        assert st["lastError"]["code"] == "delivery_timeout"
        code, _, err = cli(server, "continuations", "retry", hung["continuationId"])
        assert code == 1 and "unknown" in err and "--allow-unknown" in err
        assert hook.count(":hang") == 1

        # not-delivered holds it for an explicit retry, and that retry still needs the unsafe
        # opt-in: the verdict does not erase the unproven post. (That the running worker then
        # never posts by itself is proven deterministically, after a full worker scan, by
        # test_worker_delivery.py::test_an_operator_verdict_on_an_unknown_post_never_reposts_by_itself.)
        code, out, _ = cli(server, "continuations", "resolve", hung["continuationId"], "not-delivered")
        assert code == 0 and out.strip().endswith("delivery_retry")
        assert hook.count(":hang") == 1 and server.status(hung)["state"] == "delivery_retry"
        assert server.status(hung)["postUnproven"] is True
        code, out, _ = cli(server, "continuations", "list")
        assert code == 0 and "delivery_retry (held) (unproven post)" in out
        code, _, err = cli(server, "continuations", "retry", hung["continuationId"])
        assert code == 1 and "--allow-unknown" in err
        code, _, _ = cli(server, "continuations", "retry", hung["continuationId"], "--allow-unknown")
        assert code == 0
        server.wait_state(hung, "delivery_unknown")
        assert hook.count(":hang") == 2

        # resolve delivered: a history-only commit, nothing posted
        code, out, _ = cli(
            server, "continuations", "resolve", hung["continuationId"], "delivered", "EXT-42", "--json"
        )
        assert code == 0
        body = json.loads(out)
        assert body["state"] == "delivered"
        assert body["receipt"]["kind"] == "operator" and "EXT-42" in body["receipt"]["deliveryIds"]
        assert body["receipt"]["historyRecorded"] is True
        assert hook.count(":hang") == 2
        code, _, err = cli(server, "continuations", "resolve", hung["continuationId"], "dead-lettered")
        assert code == 1 and "not allowed" in err

        # resolve dead-lettered terminates an unknown outcome
        hung2 = server.claim("hang", "task-hang-2")
        server.result(hung2, {"summary": "z"})
        server.wait_state(hung2, "delivery_unknown")
        code, _, _ = cli(server, "continuations", "resolve", hung2["continuationId"], "dead-lettered")
        assert code == 0 and server.status(hung2)["state"] == "dead_lettered"

        # health names each cause's ids and the exact command that clears it; acknowledging
        # both dead letters clears it
        code, out, _ = cli(server, "continuations", "health")
        assert code == 2 and hung2["continuationId"] in out
        assert cli(server, "continuations", "acknowledge", hung2["continuationId"])[0] == 0
        code, out, _ = cli(server, "continuations", "health")
        assert code == 2 and hung2["continuationId"] not in out
        lines = [line.strip() for line in out.splitlines() if refused["continuationId"] in line]
        # The reversible steps come first (show, then retry where accepted); acknowledge last.
        assert lines[0].startswith("afterword continuations show --config "), lines
        (offer,) = [line for line in lines if "continuations acknowledge " in line]
        command = offer[offer.index("afterword continuations acknowledge --config ") :]
        done = run_printed(command)
        assert done.returncode == 0 and "acknowledged dead_lettered" in done.stdout
        assert server.status(refused)["acknowledgedAt"] is not None
        code, out, _ = cli(server, "continuations", "health", "--json")
        assert code == 0 and json.loads(out)["causes"] == []
        assert cli(server, "continuations", "acknowledge", refused["continuationId"])[0] == 0  # idempotent
        code, _, err = cli(server, "continuations", "acknowledge", "c_doesnotexist")
        assert code == 1 and "not_found" in err

        # usage errors exit 2; unknown ids exit 1
        assert cli(server, "continuations", "resolve", hung2["continuationId"], "delivered")[0] == 2
        assert cli(server, "continuations", "resolve", hung2["continuationId"], "maybe")[0] == 2
        code, _, err = cli(server, "continuations", "cancel", "c_doesnotexist")
        assert code == 1 and "not_found" in err

        # cancel: active -> cancelled, then idempotent
        pending = server.claim("ok", "task-pending")
        assert cli(server, "continuations", "cancel", pending["continuationId"])[0] == 0
        assert server.status(pending)["state"] == "cancelled"
        assert cli(server, "continuations", "cancel", pending["continuationId"])[0] == 0

        # human list shows every id; JSON list is one document
        code, out, _ = cli(server, "continuations", "list")
        assert code == 0
        for c in (ok, refused, hung, hung2, pending):
            assert c["continuationId"] in out
        code, out, _ = cli(server, "continuations", "list", "--json")
        doc = json.loads(out)
        assert set(doc) == {"items", "nextCursor"} and doc["nextCursor"] is None
        assert {i["continuationId"] for i in doc["items"]} >= {
            ok["continuationId"],
            pending["continuationId"],
        }

        # metrics on the operator API
        metrics = server.http.get(server.base + "/v1/operator/metrics", headers={"Authorization": "Bearer x"})
        assert metrics.status_code == 401

        # one structured line per state change, without tokens or payloads
        log_text = server.log()
        assert '"to":"delivered"' in log_text
        assert ok["resultToken"] not in log_text and "all good" not in log_text
    assert run_cli("continuations", "health", config=config).returncode == 3


@pytest.mark.slow
def test_pagination_walks_every_record_once_in_text_and_json_and_keeps_filters(
    tmp_path: Path, hook: FakeWebhook
) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config) as server:
        ids = {
            server.claim("quiet", f"page-{i:03d}")["continuationId"] for i in range(25)
        }  # 3 pages of 10: the size proves nothing more
        seen: list[str] = []
        done = run_cli("continuations", "list", "--limit", "10", config=config)
        pages = 0
        while True:
            pages += 1
            assert done.returncode == 0, done.stderr
            rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("c_")]
            seen.extend(rows)
            if "next page:" not in done.stdout:
                break
            command = done.stdout.strip().splitlines()[-1].strip()
            assert "--cursor" in command and "--limit 10" in command
            done = run_printed(command)
        assert pages == 3 and len(seen) == 25 and set(seen) == ids

        cursor = None
        json_ids: list[str] = []
        while True:
            args = ["continuations", "list", "--json", "--limit", "10"] + (
                ["--cursor", cursor] if cursor else []
            )
            doc = json.loads(run_cli(*args, config=config).stdout)
            json_ids += [i["continuationId"] for i in doc["items"]]
            cursor = doc["nextCursor"]
            if cursor is None:
                break
        assert json_ids == seen

        bad = run_cli("continuations", "list", "--cursor", "not-a-cursor", config=config)
        assert bad.returncode == 1 and "invalid cursor" in bad.stderr
        forged = run_cli("continuations", "list", "--cursor", cursor_forged(), config=config)
        assert forged.returncode == 1 and "invalid cursor" in forged.stderr
        big = run_cli("continuations", "list", "--limit", "101", config=config)
        assert big.returncode == 1 and "page size" in big.stderr

        # filters and order: the printed next command keeps them
        done = run_cli(
            "continuations",
            "list",
            "--limit",
            "10",
            "--route",
            "quiet",
            "--state",
            "claimed",
            "--newest",
            config=config,
        )
        assert done.returncode == 0, done.stderr
        command = done.stdout.strip().splitlines()[-1].strip()
        assert "--route quiet" in command and "--state claimed" in command and "--newest" in command
        rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("c_")]
        rows += [
            line.split()[0] for line in run_printed(command).stdout.splitlines() if line.startswith("c_")
        ]
        assert rows == list(reversed(seen))[: len(rows)] and len(rows) == 20
        none = run_cli("continuations", "list", "--json", "--server", "nobody", config=config)
        assert json.loads(none.stdout) == {"items": [], "nextCursor": None}
        bad_state = run_cli("continuations", "list", "--state", "nonsense", config=config)
        # Refused by argument parsing now (exit 2), before any request reaches the service.
        assert bad_state.returncode == 2 and "invalid choice: 'nonsense'" in bad_state.stderr


def cursor_forged() -> str:
    import base64

    body = base64.urlsafe_b64encode(b"0:c_aaaa").decode().rstrip("=")
    return body + "." + "0" * 32


def test_secret_missing_or_foreign_fails_closed(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config):
        pass  # creates the state directory and its secret
    secret = tmp_path / "state" / "secret"
    os.chmod(secret, 0o644)
    done = run_cli("continuations", "list", config=config)
    assert done.returncode != 0 and "permissive_mode" in done.stderr
    os.chmod(secret, 0o600)
    if os.geteuid() == 0:
        os.chown(secret, 12345, 12345)
        done = run_cli("continuations", "health", config=config)
        assert done.returncode == 3 and "wrong_owner" in done.stderr
        os.chown(secret, 0, 0)
    secret.unlink()
    done = run_cli("continuations", "retry", "c_x", config=config)
    assert done.returncode != 0 and "secret" in done.stderr


def test_config_error_and_locked_state(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url, port=0)
    done = run_cli("serve", config=config)
    assert done.returncode == 2
    assert done.stderr.startswith("afterword: continuations.port: ephemeral port 0 is rejected")
    assert len(done.stderr.strip().splitlines()) == 1
    config = write_operator_config(tmp_path, hook.url)
    with served(config):
        (tmp_path / "other").mkdir()
        other = write_operator_config(tmp_path / "other", hook.url)
        doc = json.loads(other.read_text())
        doc["continuations"]["stateDir"] = str(tmp_path / "state")
        other.write_text(json.dumps(doc))
        done = run_cli("serve", config=other)
        assert done.returncode == 1 and "owned by another process" in done.stderr


def test_operator_cli_needs_no_detached_token(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config):
        done = run_cli("continuations", "health", config=config, without_tokens=True)
        assert done.returncode == 0 and done.stdout.startswith("healthy")


def test_sigterm_drains_in_flight_delivery(tmp_path: Path) -> None:
    slow = FakeWebhook(hang_s=2.0)
    try:
        config = write_operator_config(tmp_path, slow.url, limits={"deliveryTimeoutMs": 30000})
        server = Server(config)
        server.start()
        claim = server.claim("hang", "task-slow")
        server.result(claim, {"summary": "slow"})
        end = time.monotonic() + 10
        while slow.count(":hang") == 0 and time.monotonic() < end:
            time.sleep(0.02)
        assert slow.count(":hang") == 1
        assert server.stop(signal.SIGTERM) == 0
        assert "shutting down" in server.log()
        server.start()
        assert server.status(claim)["state"] == "delivered"
        server.stop()
        assert slow.count(":hang") == 1
    finally:
        slow.close()


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path, hook: FakeWebhook) -> None:
    import socket

    config = write_operator_config(tmp_path, hook.url)
    port = json.loads(config.read_text())["continuations"]["port"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen(1)
        done = run_cli("serve", config=config)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"afterword: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
