"""`afterword continuations ui --open` never puts the login link on a command line.

The CLI runs as a real subprocess with ``BROWSER`` naming a fake browser script (Python's
``webbrowser`` starts it with what it was asked to open as its argument). The fake records
its own argv, what the file it got looks like (mode, directory mode, owner, content), and
every process command line that carries the link's token, as ``ps`` would show them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import webbrowser
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _ui import NeverConfirms
from fakes import Clock
from fakes.harness import make_config, running

from afterword.cli.loginpage import GRACE_S, login_page, open_login_link
from afterword.cli.main import main as cli_main
from afterword.http.ui import status_page

pytestmark = pytest.mark.anyio

FAKE_BROWSER = """#!{python}
import json, os, re, stat, sys
from pathlib import Path

def holders(token):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path("/proc", pid, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(cmdline.decode(errors="replace"))
    return found

target = sys.argv[1]
path = Path(target.removeprefix("file://"))
content = path.read_text()
token = re.search(r"token=([A-Za-z0-9_-]+)", content).group(1)
st, dst = path.stat(), path.parent.stat()
Path({record!r}).write_text(json.dumps({{
    "argv": sys.argv,
    "path": str(path),
    "mode": stat.S_IMODE(st.st_mode),
    "dir_mode": stat.S_IMODE(dst.st_mode),
    "owners": [st.st_uid, dst.st_uid],
    "content": content,
    "holders": holders(token),
}}))
sys.exit({exit_code})
"""


def fake_browser(root: Path, exit_code: int = 0) -> tuple[Path, Path]:
    record = root / "browser-saw.json"
    script = root / "fake-browser"
    script.write_text(FAKE_BROWSER.format(python=sys.executable, record=str(record), exit_code=exit_code))
    script.chmod(0o755)
    return script, record


def cmdlines_with(token: str) -> list[str]:
    """Every process command line on this machine that carries ``token`` (what ``ps`` shows)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path("/proc", pid, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(cmdline.decode(errors="replace"))
    return found


async def run_ui_open(config_path: str, browser: Path) -> Any:
    env = {**os.environ, "BROWSER": str(browser)}
    argv = [sys.executable, "-m", "afterword.cli", "continuations", "ui", "--open", "--config", config_path]
    return await anyio.run_process(argv, env=env, check=False)


async def test_the_browser_gets_a_private_file_and_the_file_goes_after_expiry(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    script, record = fake_browser(tmp_path)
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()) as h:
        status_page(h.service).auth.login_ttl_ms = 1000  # so the test waits for the cleanup briefly
        done = await run_ui_open(str(config.config_path), script)
        assert done.returncode == 0, done.stderr.decode()
        (url,) = done.stdout.decode().split()
        token = url.split("token=")[1]
        saw = json.loads(record.read_text())
        # The browser's command line holds a file's path and nothing of the link.
        assert saw["argv"][1] == Path(saw["path"]).as_uri()
        assert all(token not in arg for arg in saw["argv"]), saw["argv"]
        assert saw["holders"] == []  # no process showed the token while the browser ran
        assert cmdlines_with(token) == []  # nor now, with the cleaner waiting for the expiry
        # The file: 0600 in its own 0700 directory, both ours, forwarding to the link.
        path = Path(saw["path"])
        assert (saw["mode"], saw["dir_mode"]) == (0o600, 0o700)
        assert saw["owners"] == [os.geteuid(), os.geteuid()]
        assert path.parent.parent == Path(tempfile.gettempdir()) and len(os.listdir(path.parent)) == 1
        assert saw["content"] == login_page(url).decode()
        assert f'<meta http-equiv="refresh" content="0;url={url}">' in saw["content"]
        assert "<script" not in saw["content"]
        assert token not in done.stderr.decode()
        # Still there for the browser to read: the link has not expired yet.
        assert path.exists()
        with anyio.fail_after(GRACE_S + 20):
            while path.parent.exists():
                await anyio.sleep(0.1)
        # The link itself was never spent by anyone: a real browser would have.
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(url)).status_code == 401  # expired by now


async def test_the_file_goes_at_once_when_no_browser_starts(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    script, record = fake_browser(tmp_path, exit_code=1)
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()) as h:
        done = await run_ui_open(str(config.config_path), script)
        assert done.returncode == 0
        err = done.stderr.decode()
        assert "no browser could be started" in err
        saw = json.loads(record.read_text())  # it did exist while the browser was tried
        assert saw["mode"] == 0o600
        assert not Path(saw["path"]).parent.exists()
        token = done.stdout.decode().split("token=")[1].strip()
        assert token not in err and cmdlines_with(token) == []
        # the printed link still works, for the operator to paste
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(h.service.base_url + "/ui/login?token=" + token)).status_code == 200


def test_a_launcher_that_raises_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[str] = []

    def broken(uri: str) -> bool:
        seen.append(uri)
        raise webbrowser.Error("could not locate runnable browser")

    def no_cleaner(path: str, delay: float) -> None:
        raise AssertionError("nothing to clean later")

    url = "http://127.0.0.1:1/ui/login?token=T0KEN"
    assert not open_login_link(url, int(time.time() * 1000) + 60_000, opener=broken, spawn_cleaner=no_cleaner)
    assert len(seen) == 1 and "T0KEN" not in seen[0]
    assert os.listdir(tmp_path) == []

    def interrupted(uri: str) -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        open_login_link(url, int(time.time() * 1000) + 60_000, opener=interrupted)
    assert os.listdir(tmp_path) == []


async def test_a_login_page_that_cannot_be_written_is_one_line_without_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config, env = make_config(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    monkeypatch.setattr("webbrowser.open", lambda uri: pytest.fail("no file, no browser"))
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()):
        argv = ["continuations", "ui", "--open", "--config", str(config.config_path)]
        assert await anyio.to_thread.run_sync(cli_main, argv) == 0
        out = capsys.readouterr()
        token = out.out.split("token=")[1].strip()
        (line,) = [x for x in out.err.splitlines() if "login page" in x]
        assert line.startswith("afterword: cannot write the login page") and token not in out.err


def test_the_forwarding_page_escapes_the_link() -> None:
    page = login_page('http://127.0.0.1:1/ui/login?token=a"><script>x</script>').decode()
    assert "<script>" not in page and "&quot;&gt;&lt;script&gt;" in page
