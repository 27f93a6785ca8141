"""The slow-client attack against a real ``afterword serve``, with memory figures.

Runs the service in a subprocess, then opens ``--connections`` connections that each send a
request head announcing a 200 KB body (under the result limit) and trickle one byte every ``--every`` seconds, half
with a stranger's credential (``Bearer x``) and half with a real result token. It samples the
service's resident memory (VmRSS) before, during and after the attack, and counts how many
attack connections the server still holds at the peak and after (from its own metrics).

    python -m tools.slowclient --connections 300 --seconds 20

``--livez`` runs the slot-holding attack instead: each connection polls ``/v1/livez`` every
``--every`` seconds on keep-alive (reconnecting at once when the server closes it), while the
operator (``/v1/operator/health``) and a producer (a detached claim) each ask once a second
on a fresh connection; it counts their answers by status.

Prints one JSON object. Nothing here is asserted; tests/e2e/test_http_connections.py holds the
checks, this is the measurement behind the figures in docs/http-hardening.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from .killtest.observe import rss_kib

TOKEN = "slowclient-detached-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _operator_token(state: Path) -> str:
    from afterword.continuations.capabilities import operator_token
    from afterword.store.keys import OPERATOR, derive_key

    return operator_token(derive_key((state / "secret").read_bytes(), OPERATOR))


def _metric(base: str, token: str, name: str) -> float:
    text = httpx.get(
        base + "/v1/operator/metrics", headers={"Authorization": f"Bearer {token}"}, trust_env=False
    ).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else -1.0


def _claim(base: str) -> dict[str, Any]:
    deadline = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    r = httpx.post(
        base + "/v1/continuations/detached/claim",
        headers={"Authorization": f"Bearer {TOKEN}", "X-Mono-Agent-Service-Name": "attacker"},
        json={
            "route": "r",
            "taskKey": "slow",
            "taskHash": hashlib.sha256(b"t").hexdigest(),
            "deadline": deadline,
        },
        trust_env=False,
    )
    r.raise_for_status()
    return dict(r.json())


async def _trickler(port: int, head: bytes, every: float, until: float, alive: list[int], index: int) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    alive[index] = 1
    try:
        writer.write(head)
        await writer.drain()
        while time.monotonic() < until:
            writer.write(b" ")
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), every)
            except TimeoutError:
                continue
            if not data:
                break  # the server closed it
        # (an answer without a close still counts as held until the server lets go)
    except OSError:
        pass
    finally:
        alive[index] = 0
        writer.close()


async def _attack(port: int, heads: list[bytes], every: float, seconds: float, sample: Any) -> dict[str, Any]:
    until = time.monotonic() + seconds
    alive = [0] * len(heads)
    tasks = [asyncio.ensure_future(_trickler(port, h, every, until, alive, i)) for i, h in enumerate(heads)]
    peaks: list[int] = []
    held: list[float] = []
    while time.monotonic() < until:
        await asyncio.sleep(1.0)
        peaks.append(sample())
        held.append(await asyncio.to_thread(sample.connections))
    alive_at_end = sum(alive)
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "rss_during_max_mib": round(max(peaks) / 1024, 1) if peaks else None,
        "server_connections_max": max(held) if held else None,
        "server_connections_at_end_of_attack": held[-1] if held else None,
        "client_connections_still_open_at_end": alive_at_end,
    }


async def _poller(port: int, every: float, until: float, counts: dict[str, int]) -> None:
    head = f"GET /v1/livez HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        counts["connects"] += 1
        try:
            while time.monotonic() < until:
                writer.write(head)
                await writer.drain()
                data = await asyncio.wait_for(reader.read(4096), 5)
                if not data:
                    break  # the server let this connection go: come straight back
                await asyncio.sleep(every)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()


async def _livez_attack(port: int, connections: int, every: float, seconds: float, op: str) -> dict[str, Any]:
    until = time.monotonic() + seconds
    counts = {"connects": 0}
    pollers = [asyncio.ensure_future(_poller(port, every, until, counts)) for _ in range(connections)]
    await asyncio.sleep(min(3.0, seconds / 4))  # let the crowd take the slots
    answers: dict[str, dict[str, int]] = {"operator": {}, "claim": {}}
    deadline = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    i = 0
    async with httpx.AsyncClient(
        trust_env=False, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)
    ) as c:
        while time.monotonic() < until:
            i += 1
            asks = {
                "operator": c.get(
                    f"http://127.0.0.1:{port}/v1/operator/health", headers={"Authorization": f"Bearer {op}"}
                ),
                "claim": c.post(
                    f"http://127.0.0.1:{port}/v1/continuations/detached/claim",
                    headers={"Authorization": f"Bearer {TOKEN}", "X-Mono-Agent-Service-Name": "attacker"},
                    json={"route": "r", "taskKey": f"k{i}", "taskHash": "h" * 64, "deadline": deadline},
                ),
            }
            for name, ask in asks.items():
                try:
                    status = str((await ask).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                answers[name][status] = answers[name].get(status, 0) + 1
            await asyncio.sleep(1.0)
    await asyncio.gather(*pollers, return_exceptions=True)
    return {"poller_connects": counts["connects"], "answers": answers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between trickled bytes (or polls)")
    ap.add_argument("--livez", action="store_true", help="the slot-holding attack (see above)")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="afterword-slowclient-"))
    os.chmod(root, 0o700)
    port = _free_port()
    (root / "afterword.json").write_text(
        json.dumps(
            {
                "continuations": {
                    "port": port,
                    "stateDir": "state",
                    "namedRoutes": {"r": {"mode": "capture", "conversationId": "local:r"}},
                    "detachedServices": [{"name": "attacker", "tokenEnv": "SLOWCLIENT_TOKEN"}],
                }
            }
        )
    )
    env = {**os.environ, "SLOWCLIENT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "afterword.cli", "serve", "--config", str(root / "afterword.json")],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "serve.log", "wb"),  # noqa: SIM115 - handed to the child
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(base + "/v1/operator/health", trust_env=False)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        op = _operator_token(root / "state")
        claim = _claim(base)
        path = claim["resultUrl"].split(str(port), 1)[1]
        time.sleep(1.0)

        def sample() -> int:
            return rss_kib(proc.pid) or 0

        sample.connections = lambda: _metric(base, op, "afterword_http_connections")  # type: ignore[attr-defined]
        before = sample()
        if args.livez:
            held = asyncio.run(_livez_attack(port, args.connections, args.every, args.seconds, op))
            print(json.dumps({"connections": args.connections, "poll_every_s": args.every, **held}, indent=2))
            return 0
        heads = []
        for i in range(args.connections):
            token = "x" if i % 2 == 0 else claim["resultToken"]
            heads.append(
                (
                    f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n"
                ).encode()
            )
        during = asyncio.run(_attack(port, heads, args.every, args.seconds, sample))
        time.sleep(3.0)
        after = sample()
        report = {
            "connections_attempted": args.connections,
            "trickle_every_s": args.every,
            "attack_seconds": args.seconds,
            "rss_before_mib": round(before / 1024, 1),
            **during,
            "rss_after_mib": round(after / 1024, 1),
            "server_connections_after": _metric(base, op, "afterword_http_connections"),
            "refused_at_cap": _metric(base, op, "afterword_http_connections_refused_total"),
            "log_lines": len((root / "serve.log").read_text().splitlines()),
        }
        print(json.dumps(report, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
