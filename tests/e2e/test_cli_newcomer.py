"""What a new operator meets: help, version, errors that say what to do next, `show`, the
list's outcome column, metrics (and the read-only metrics capability), and `/v1/livez`."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _cli import CLI, FakeWebhook, Server, cli, env, served, write_operator_config

from afterword import __version__
from afterword.cli.main import build_parser
from afterword.cli.render import state_label as _state_label

pytestmark = pytest.mark.timeout(240)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_command_argument_and_option_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # no line breaks inside the words checked below
    missing = []
    for prog, parser in _parsers(build_parser()):
        if parser.description is None and prog != "afterword":
            missing.append(f"{prog}: no description")
        for action in parser._actions:
            if action.help is None and not isinstance(action, argparse._SubParsersAction):
                missing.append(f"{prog} {action.dest}")
    assert not missing
    resolve = next(p for prog, p in _parsers(build_parser()) if prog.endswith("resolve")).format_help()
    for verdict in ("delivered", "not-delivered", "dead-lettered"):
        assert verdict in resolve


def test_version_and_python_m() -> None:
    for argv in ([sys.executable, "-m", "afterword", "--version"], [*CLI, "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout.strip() == f"afterword {__version__}"
    done = subprocess.run([sys.executable, "-m", "afterword", "demo", "-h"], capture_output=True, text=True)
    assert done.returncode == 0 and "temporary directory" in done.stdout


def test_python_m_afterword_from_the_clones_parent_directory(tmp_path: Path) -> None:
    """Run beside a folder named ``afterword`` (a clone of this repository, seen from its
    parent), ``python -m afterword`` still runs the installed package, not the folder."""
    (tmp_path / "afterword" / "docs").mkdir(parents=True)  # a folder without __init__.py
    done = subprocess.run(
        [sys.executable, "-m", "afterword", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"afterword {__version__}"


def test_errors_say_what_to_do_next_and_json_errors_are_json(tmp_path: Path) -> None:
    cwd = tmp_path / "empty"
    cwd.mkdir()
    done = subprocess.run(
        [*CLI, "continuations", "list"], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 3
    assert "pass --config" in done.stderr and "`afterword serve` first" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run(
        [*CLI, "continuations", "list", "--json"], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 3 and done.stderr == ""
    assert json.loads(done.stdout)["error"]["code"] == "no_state"
    done = subprocess.run(
        [*CLI, "continuations", "resolve", "c_x", "maybe", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "invalid choice" in json.loads(done.stdout)["error"]["message"]


def test_state_labels_tell_held_from_scheduled() -> None:
    assert _state_label("delivery_retry", True, None) == "delivery_retry (held)"
    assert _state_label("delivery_retry", False, "2030-01-01T00:00:01.000Z").endswith(
        "(next 2030-01-01T00:00:01.000Z)"
    )
    assert _state_label("delivered", False, None) == "delivered"


@pytest.mark.slow
def test_operator_path_show_list_outcome_metrics_livez(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config) as server:
        livez = httpx.get(server.base + "/v1/livez")
        assert livez.status_code == 200 and livez.json() == {"status": "up"}

        ok = server.claim("ok", "task-ok")
        server.result(ok, {"summary": "all good"})
        server.wait_state(ok, "delivered")
        quiet = server.claim("quiet", "task-quiet")
        server.result(quiet, {"anything": 1})
        server.wait_state(quiet, "delivered")

        hung = server.claim("hang", "task-hang")
        server.result(hung, {"summary": "y"})
        server.wait_state(hung, "delivery_unknown")
        hid = hung["continuationId"]
        code, out, err = cli(server, "continuations", "retry", hid)
        assert code == 1 and "--allow-unknown" in err and f"afterword continuations show {hid}" in err
        code, out, _ = cli(server, "continuations", "retry", hid, "--json")
        assert code == 1 and json.loads(out)["error"]["code"] == "conflict"
        assert cli(server, "continuations", "resolve", hid, "not-delivered")[0] == 0

        code, out, _ = cli(server, "continuations", "list")
        assert code == 0 and "OUTCOME" in out.splitlines()[0]
        rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("c_")}
        assert " posted " in rows[ok["continuationId"]]
        assert " silent " in rows[quiet["continuationId"]]
        assert "delivery_retry (held)" in rows[hid]
        code, out, _ = cli(server, "continuations", "list", "--json")
        held = next(i for i in json.loads(out)["items"] if i["continuationId"] == hid)
        assert held["held"] is True and held["nextAttemptAt"] is None and held["outcome"] is None

        code, out, _ = cli(server, "continuations", "show", ok["continuationId"])
        assert code == 0
        assert "outcome" in out and "posted" in out and "receipt" in out and "completion kind" in out
        code, out, _ = cli(server, "continuations", "show", hid, "--json")
        detail = json.loads(out)
        states = [h["state"] for h in detail["history"]]
        assert states[0] == "claimed" and states[-2:] == ["delivery_unknown", "delivery_retry"]
        assert "result_received" in states and detail["historyComplete"] is True
        unknown = next(h for h in detail["history"] if h["state"] == "delivery_unknown")
        assert unknown["error"] == "delivery_timeout" and unknown["at"].endswith("Z")
        assert detail["status"]["attempts"]["delivery"] == 1 and detail["route"] == "hang"
        code, _, err = cli(server, "continuations", "show", "c_nosuch")
        assert code == 1 and "afterword continuations list" in err

        code, out, _ = cli(server, "continuations", "metrics")
        assert code == 0 and 'afterword_continuations{state="delivered"} 2.0' in out

        token_file = tmp_path / "prom" / "afterword.token"
        token_file.parent.mkdir()
        code, out, _ = cli(server, "continuations", "metrics-token", "--file", str(token_file))
        assert code == 0 and str(token_file) in out
        # The first releases' positional form still works, and says which form replaces it.
        code, _, err = cli(server, "continuations", "metrics-token", str(token_file) + ".old")
        assert code == 0 and "deprecated" in err and "metrics-token --file PATH" in err
        assert (tmp_path / "prom" / "afterword.token.old").read_text() == token_file.read_text()
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = token_file.read_text()
        assert token not in out
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(server.base + "/v1/operator/metrics", headers=bearer).status_code == 200
        for path in (
            "/v1/operator/health",
            "/v1/operator/continuations",
            f"/v1/operator/continuations/{hid}",
        ):
            assert httpx.get(server.base + path, headers=bearer).status_code == 401
        retry = httpx.post(server.base + f"/v1/operator/continuations/{hid}/retry", headers=bearer, json={})
        assert retry.status_code == 401
    code = subprocess.run(
        [*CLI, "continuations", "health", "--config", str(config)], capture_output=True, text=True, env=env()
    )
    assert code.returncode == 3 and "/v1/livez" in code.stderr and server.base in code.stderr


def test_serve_without_the_detached_token_runs_and_says_which_service_cannot_claim(
    tmp_path: Path, hook: FakeWebhook
) -> None:
    config = write_operator_config(tmp_path, hook.url)
    e = env()
    e.pop("AFTERWORD_TEST_DETACHED_TOKEN")
    server = Server(config)
    log = open(tmp_path / "serve.log", "ab")  # noqa: SIM115 - handed to the child
    server.proc = subprocess.Popen([*CLI, "serve", "--config", str(config)], stdout=log, stderr=log, env=e)
    try:
        import time

        end = time.monotonic() + 20
        while True:
            try:
                if httpx.get(server.base + "/v1/livez").status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < end and server.proc.poll() is None
                time.sleep(0.05)
        r = httpx.post(
            server.base + "/v1/continuations/detached/claim",
            headers={"Authorization": "Bearer anything-at-all-0123456", "X-Mono-Agent-Service-Name": "svc"},
            json={"route": "ok", "taskKey": "k", "taskHash": "h", "deadline": "2099-01-01T00:00:00.000Z"},
        )
        assert r.status_code == 401
    finally:
        assert server.stop() == 0
    text = server.log()
    assert "detached service 'svc' cannot claim until AFTERWORD_TEST_DETACHED_TOKEN" in text
    # The start banner says where answers go, so a wrong webhook shows before the first delivery.
    hook_host = hook.url.split("//", 1)[1].split("/", 1)[0]
    assert f"  channels: hook -> webhook {hook_host}, * -> outbox {tmp_path / 'outbox.jsonl'}\n" in text
    assert "  named routes: ok, refuse, hang, capture, quiet\n" in text
    assert "  detached services: svc\n" in text


def test_both_token_commands_take_the_file_as_file_option() -> None:
    """One form for the two commands that write a capability to a file: ``--file PATH``."""
    parser = build_parser()
    for verb in ("metrics-token", "host-token"):
        args = parser.parse_args(["continuations", verb, "--file", "x.token"])
        assert args.file == "x.token"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--limit", "0"], "--limit"),
        (["--limit", "-3"], "--limit"),
        (["--limit", "ten"], "--limit"),
        (["--state", "bogus"], "--state"),
    ],
)
def test_list_filters_are_refused_by_argument_parsing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    said: str,
) -> None:
    """Exit 2 with the usage line, before any state is read or the service is asked."""
    from afterword.cli.main import main

    monkeypatch.chdir(tmp_path)  # no service state here: the old code got as far as exit 3
    with pytest.raises(SystemExit) as stopped:
        main(["continuations", "list", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "usage:" in err


def test_list_state_help_names_every_state() -> None:
    from afterword.continuations.model import STATES

    ls = next(p for prog, p in _parsers(build_parser()) if prog.endswith("continuations list"))
    assert ls.parse_args(["--state", "delivery_unknown"]).state == "delivery_unknown"
    text = ls.format_help()
    assert all(state in text for state in STATES)


def test_the_start_banner_names_destinations_without_secrets(tmp_path: Path) -> None:
    from afterword.cli.serve import banner
    from afterword.config import config_from_mapping

    secret = "s3cr3t-0123456789abcdef"
    config = config_from_mapping(
        {
            "continuations": {
                "channels": {
                    "hook": {
                        "adapter": "webhook",
                        "url": f"https://user:{secret}@hooks.example.com:8443/services/{secret}?key={secret}",
                        "headers": {"X-Key": secret},
                    },
                    "slack": {"adapter": "slack", "tokenEnv": "SLACK_TOKEN"},
                    "*": {"adapter": "outbox", "path": "answers.jsonl"},
                },
                "namedRoutes": {"daily": {"mode": "capture", "conversationId": "local:x"}},
                "detachedServices": [{"name": "cron", "tokenEnv": "CRON_TOKEN"}],
            }
        },
        str(tmp_path),
        environ={"SLACK_TOKEN": secret, "CRON_TOKEN": secret},
    )
    lines = banner(config)
    assert lines[1:] == [
        f"  channels: hook -> webhook hooks.example.com:8443, slack -> slack slack.com, * -> outbox {tmp_path / 'answers.jsonl'}",
        "  named routes: daily",
        "  detached services: cron",
    ]
    assert secret not in "\n".join(lines) and "user" not in "\n".join(lines)
    assert banner(config, "/tmp/elsewhere.jsonl")[1].endswith("* -> outbox /tmp/elsewhere.jsonl")


def test_readme_opens_with_what_it_is_then_the_two_commands() -> None:
    """Three plain lines (what afterword is, for whom, which problem), then the Python it
    needs and the two commands (the demo, the tests), then how long the tests take."""
    root = Path(__file__).resolve().parents[2]
    lines = (root / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# afterword"
    body = [line for line in lines[1:] if line.strip()]
    opening = body[:3]
    assert all(line[0].isalpha() and line.endswith(".") and len(line) <= 100 for line in opening), opening
    assert "agent hosts" in opening[0] and "for" in opening[1] and "answer later" in opening[2]
    fence = body.index("```sh")
    assert fence == 4  # one line between the three and the commands: what it needs
    requires = re.search(r'requires-python = ">=(\d+\.\d+)"', (root / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]
    assert f"Python {requires} or newer" in body[3]
    commands = body[fence + 1 : body.index("```", fence + 1)]
    assert len(commands) == 2
    # The demo's server and host run on the MCP SDK, which is the `mcp` extra (docs/mcp.md).
    assert commands[0].endswith("pip install -e '.[mcp]' && afterword demo")
    assert commands[1].endswith("pip install -e '.[test]' && python -m pytest -q")
    after = " ".join(body[body.index("```", fence + 1) + 1 :][:4])
    assert re.search(r"the test suite\s+without the tests marked `slow`: about \d+ minutes", after)


def test_list_marks_an_acknowledged_record(capsys: pytest.CaptureFixture[str]) -> None:
    from afterword.cli.render import print_page
    from afterword.protocol.wire import AttemptsBody, ErrorDetail, ListItem, ListResponse

    def item(cid: str, acknowledged_at: str | None) -> ListItem:
        return ListItem(
            continuation_id=cid,
            state="dead_lettered",
            origin_context="detached_latest",
            mode="notify_if_actionable",
            kind="detached",
            server_name="svc",
            route="ops",
            attempts=AttemptsBody(synthesis=1, delivery=1),
            last_error=ErrorDetail(code="http_400", message="refused"),
            created_at="2026-12-01T00:00:00.000Z",
            updated_at="2026-12-01T00:00:01.000Z",
            compacted=False,
            acknowledged_at=acknowledged_at,
        )

    print_page(
        ListResponse(
            items=[item("c_seen", "2026-12-01T00:00:02.000Z"), item("c_new", None)], next_cursor=None
        ),
        None,
    )
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "dead_lettered (acknowledged)" in rows["c_seen"]
    assert "acknowledged" not in rows["c_new"]
