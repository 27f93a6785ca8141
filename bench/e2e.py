"""End-to-end continuations/s: claim + result + synthesis + outbox delivery, over real HTTP.

Run from the repository root::

    python -m bench.e2e                 # 1 and 64 concurrent producers, all scenarios
    python -m bench.e2e --producers 64 --n 3000
    python -m bench.e2e --producers 1 32 --scenarios bare detached dbos rss --json e2e.json

Scenarios, each measured side by side in one run on the same disk:

* ``bare``: a bare Quart + hypercorn JSON endpoint (no state) in its own process, driven by the
  same client. Two of its requests per continuation give the HTTP ceiling for the others.
* ``detached``: ``afterword serve`` (the real CLI) in its own process; producers in this one
  make a detached claim and submit its result (two requests). A continuation counts when its
  line is in ``outbox.jsonl``; the template synthesizer runs in between.
* ``dbos``: DBOS Transact on SQLite (``bench/e2e_dbos.py``), 64 workflows in flight, each
  doing recv + one step; the peer a user might pick instead.
* ``rss``: ``afterword serve``'s resident memory holding 10,000 active continuations and
  50,000 tombstones (``bench/e2e_rss.py``), beside its memory on an empty state.
* ``interactive``: the embedded app handle in this process, as an agent host embeds it: per
  continuation the host begins a run, the producer claims over HTTP, the host closes,
  finalizes (snapshot blob) and activates the run, then the producer submits the result.

Figures are printed, never asserted: a continuation/s rate over the whole batch (first
request to last outbox line), result-to-delivery latency percentiles, and the server process's
CPU time per continuation (``cpu ms/c``: utime + stime of its pid from ``/proc/PID/stat``, read
just before the batch's first request and after its last outbox line, divided by the
continuations; for ``bare``, per two requests). That CPU figure is the one to compare before and
after a change on a shared machine, where wall-clock rates move with other load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from .common import REPO, output_path, percentile, scratch_base, scratch_dir
from .e2e_dbos import run_dbos
from .e2e_rss import RssFigure, fill_state, serve_rss

TOKEN_ENV = "AFTERWORD_BENCH_DETACHED_TOKEN"
TOKEN = "bench-detached-token-0123456789"
ROUTE = "bench"
WARMUP = 20
HISTORY = (
    {"role": "user", "content": "Please run the nightly report."},
    {"role": "assistant", "content": "Started; I will report back."},
)


@dataclass
class Figure:
    scenario: str
    producers: int
    n: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    # CPU seconds (user + system) the server process spent over the measured batch, or None.
    cpu_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms(self) -> float | None:
        """The server's CPU milliseconds per continuation (for bare: per two requests)."""
        if self.cpu_seconds is None or self.n <= 0:
            return None
        return self.cpu_seconds * 1000 / self.n


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (utime + stime of /proc/PID/stat).

    CPU time rather than wall time is what a before/after comparison of the server's own cost
    needs on a shared machine: other load stretches the wall clock but not the process's CPU.
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces; the fields after its closing ')' start at 3.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MAX_CONCURRENT = 16  # the documented default worker bound; --max-concurrent changes it


def write_config(root: Path) -> Path:
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"work-control": {"command": "true"}}}))
    doc = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": ["work-control"]},
        "continuations": {
            "host": "127.0.0.1",
            "port": free_port(),
            "stateDir": "state",
            # Admission limits raised so a fast producer is never refused mid-batch.
            "limits": {
                "maxActiveRecords": 100_000,
                "maxActivePerOrigin": 100_000,
                "maxConcurrent": MAX_CONCURRENT,
            },
            "namedRoutes": {ROUTE: {"mode": "notify_if_actionable", "conversationId": "local:bench"}},
            "detachedServices": [{"name": "work-control", "tokenEnv": TOKEN_ENV}],
        },
    }
    path = root / "afterword.json"
    path.write_text(json.dumps(doc))
    return path


def deadline() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() + 86400))


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def payload_hash(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for the bench.

    A general-purpose client (httpx) costs more CPU per request than the server under test on
    these 2-core machines, so it would measure itself; each producer owns one of these instead.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._stream: anyio.abc.SocketStream | None = None
        self._buffer = b""

    async def request(self, method: str, url: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        try:
            return await self._request(method, url, body, headers)
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            # hypercorn closes a keep-alive connection after keep_alive_max_requests (1,000 by
            # default); every request here is idempotent, so reconnect and send it again.
            self._stream = None
            self._buffer = b""
            return await self._request(method, url, body, headers)

    async def _request(self, method: str, url: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        if self._stream is None:
            self._stream = await anyio.connect_tcp("127.0.0.1", self.port)
        path = "/" + url.split("/", 3)[3] if url.startswith("http") else url
        data = _encode(body)
        head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", f"Content-Length: {len(data)}"]
        head.append("Content-Type: application/json")
        head.extend(f"{k}: {v}" for k, v in (headers or {}).items())
        await self._stream.send(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        raw_head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        while len(self._buffer) < length:
            self._buffer += await self._stream.receive()
        payload, self._buffer = self._buffer[:length], self._buffer[length:]
        if status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:200]!r}")
        return _decode(payload)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


async def run_producers(
    producers: int, port: int, n: int, one: Callable[[Connection, int], Awaitable[None]]
) -> None:
    next_index = iter(range(n))

    async def producer() -> None:
        conn = Connection(port)
        try:
            for i in next_index:
                await one(conn, i)
        finally:
            await conn.aclose()

    async with anyio.create_task_group() as tg:
        for _ in range(producers):
            tg.start_soon(producer)


def ms_of(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


# -- bare Quart + hypercorn ---------------------------------------------------------------------
def _bare_server(port: int) -> None:
    import asyncio

    from hypercorn.asyncio import serve
    from hypercorn.config import Config
    from quart import Quart, request

    app = Quart("bare")

    @app.post("/echo")
    async def echo() -> dict[str, Any]:
        body = await request.get_json()
        return {"ok": True, "n": body.get("n")}

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    # The same listener settings as afterword's own server (afterword/http/server.py).
    config.backlog = 512
    config.keep_alive_timeout = 30.0
    asyncio.run(serve(app, config))


async def wait_port(port: int, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def bench_bare(producers: int, n: int) -> Figure:
    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(target=_bare_server, args=(port,), daemon=True)
    proc.start()
    try:
        await wait_port(port)

        async def one(conn: Connection, i: int) -> None:
            for _ in range(2):  # a continuation costs two requests
                await conn.request("POST", "/echo", {"n": i})

        await run_producers(producers, port, WARMUP, one)
        assert proc.pid is not None
        cpu_began = process_cpu_seconds(proc.pid)
        began = time.perf_counter()
        await run_producers(producers, port, n, one)
        seconds = time.perf_counter() - began
        cpu = process_cpu_seconds(proc.pid) - cpu_began
        return Figure("bare (2 req)", producers, n, seconds, cpu_seconds=cpu)
    finally:
        proc.terminate()
        proc.join(10)


# -- detached, against `afterword serve` ---------------------------------------------------------
class LineCounter:
    """Counts the outbox's lines, reading only what was appended since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


async def bench_detached(base: str, producers: int, n: int, tree: Path | None = None) -> Figure:
    """``tree`` None: this checkout's serve; else the serve of that source tree (an older
    commit unpacked with ``git archive``), named in the row, for a before/after run."""
    with scratch_dir(base) as scratch:
        root = Path(scratch)
        config_path = write_config(root)
        config = json.loads(config_path.read_text())["continuations"]
        outbox = root / "outbox.jsonl"
        count_lines = LineCounter(outbox)
        env = {**os.environ, TOKEN_ENV: TOKEN, "PYTHONPATH": str(tree or REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "afterword.cli", "serve", "--config", str(config_path)],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_port(config["port"])
            put_at: dict[str, float] = {}
            headers = {"Authorization": f"Bearer {TOKEN}", "X-Mono-Agent-Service-Name": "work-control"}

            def make(prefix: str) -> Callable[[Connection, int], Awaitable[None]]:
                async def one(conn: Connection, i: int) -> None:
                    key = f"{prefix}-{i}"
                    claim = await conn.request(
                        "POST",
                        "/v1/continuations/detached/claim",
                        {"route": ROUTE, "taskKey": key, "taskHash": "h" + key, "deadline": deadline()},
                        headers,
                    )
                    payload = {"summary": f"report {i} is ready", "actionable": True}
                    put_at[claim["continuationId"]] = time.time() * 1000
                    await conn.request(
                        "PUT",
                        claim["resultUrl"],
                        {"idempotencyKey": key, "payloadHash": payload_hash(payload), "payload": payload},
                        {"Authorization": f"Bearer {claim['resultToken']}"},
                    )

                return one

            await run_producers(producers, config["port"], WARMUP, make("warm"))
            while count_lines() < WARMUP:
                await anyio.sleep(0.01)
            put_at.clear()
            cpu_began = process_cpu_seconds(proc.pid)
            began = time.perf_counter()
            await run_producers(producers, config["port"], n, make("run"))
            while count_lines() < WARMUP + n:
                await anyio.sleep(0.005)
            seconds = time.perf_counter() - began
            cpu = process_cpu_seconds(proc.pid) - cpu_began
            lines = [json.loads(line) for line in outbox.read_text().splitlines()[WARMUP:]]
            latencies = sorted(
                ms_of(line["deliveredAt"]) - put_at[line["deliveryKey"].split(":")[0]] for line in lines
            )
            name = "detached (serve)" if tree is None else f"detached (serve of {tree.name})"
            return Figure(name, producers, n, seconds, latencies, cpu)
        finally:
            proc.terminate()
            proc.wait(30)


# -- interactive, embedded app handle ------------------------------------------------------------
async def bench_interactive(base: str, producers: int, n: int) -> Figure:
    import afterword
    from afterword.continuations.model import Continuation

    with scratch_dir(base) as scratch:
        root = Path(scratch)
        env = {TOKEN_ENV: TOKEN}
        config = afterword.load_config(write_config(root), environ=env)
        async with afterword.open_service(config, environ=env) as service:
            put_at: dict[str, float] = {}
            delivered_at: dict[str, float] = {}
            target = {"n": WARMUP}
            done = anyio.Event()

            def on_change(old: Continuation | None, new: Continuation) -> None:
                if new.state == "delivered" and (old is None or old.state != "delivered"):
                    delivered_at[new.id] = time.time() * 1000
                    if len(delivered_at) >= target["n"]:
                        done.set()

            service.on_change.append(on_change)

            def make(prefix: str) -> Callable[[Connection, int], Awaitable[None]]:
                async def one(conn: Connection, i: int) -> None:
                    run = f"{prefix}-{i}"
                    binding = service.begin_run(run, f"local:{run}", f"local:{run}")
                    cap = binding.stdio_env("work-control")
                    claim = await conn.request(
                        "POST",
                        cap["MONO_AGENT_CONTINUATION_CLAIM_URL"],
                        {"taskKey": run, "taskHash": "h" + run, "deadline": deadline()},
                        {"Authorization": f"Bearer {cap['MONO_AGENT_CONTINUATION_CLAIM_TOKEN']}"},
                    )
                    await binding.close()
                    await binding.finalize(HISTORY)
                    await binding.activate()
                    payload = {"summary": f"report {i} is ready"}
                    put_at[claim["continuationId"]] = time.time() * 1000
                    await conn.request(
                        "PUT",
                        claim["resultUrl"],
                        {"idempotencyKey": run, "payloadHash": payload_hash(payload), "payload": payload},
                        {"Authorization": f"Bearer {claim['resultToken']}"},
                    )

                return one

            port = config.port
            await run_producers(producers, port, WARMUP, make("warm"))
            await done.wait()
            delivered_at.clear()
            put_at.clear()
            done = anyio.Event()
            target["n"] = n
            began = time.perf_counter()
            await run_producers(producers, port, n, make("run"))
            await done.wait()
            seconds = time.perf_counter() - began
            latencies = sorted(delivered_at[cid] - put_at[cid] for cid in put_at)
            return Figure("interactive (embedded)", producers, n, seconds, latencies)


def ratios(figures: list[Figure]) -> list[dict[str, Any]]:
    """Each scenario against the bare ceiling at the same producer count, and against DBOS."""
    bare = {f.producers: f.rate for f in figures if f.scenario.startswith("bare")}
    dbos = next((f.rate for f in figures if f.scenario.startswith("dbos")), None)
    out: list[dict[str, Any]] = []
    for f in figures:
        if f.scenario.startswith(("bare", "dbos")):
            continue
        if f.producers in bare:
            out.append(
                {
                    "scenario": f.scenario,
                    "producers": f.producers,
                    "against": "bare",
                    "ratio": f.rate / bare[f.producers],
                }
            )
        if dbos:
            out.append(
                {"scenario": f.scenario, "producers": f.producers, "against": "dbos", "ratio": f.rate / dbos}
            )
    return out


def report(figures: list[Figure], rss: RssFigure | None = None) -> None:
    print(
        f"{'scenario':<24} {'producers':>9} {'n':>6} {'seconds':>8} {'cont/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'cpu ms/c':>9}"
    )
    for f in figures:
        lat = f.latencies_ms
        p50 = f"{percentile(lat, 50):8.1f}" if lat else f"{'-':>8}"
        p99 = f"{percentile(lat, 99):8.1f}" if lat else f"{'-':>8}"
        cpu = f"{f.cpu_ms:9.3f}" if f.cpu_ms is not None else f"{'-':>9}"
        print(
            f"{f.scenario:<24} {f.producers:>9} {f.n:>6} {f.seconds:>8.2f} {f.rate:>8.1f} {p50} {p99} {cpu}"
        )
    print("cpu ms/c: the server process's user+system CPU per continuation (bare: per two requests)")
    for r in ratios(figures):
        what = "the bare ceiling" if r["against"] == "bare" else "DBOS Transact's rate"
        print(f"{r['scenario']} with {r['producers']} producer(s): {r['ratio']:.0%} of {what}")
    bare_cpu = {f.producers: f.cpu_ms for f in figures if f.scenario.startswith("bare")}
    for f in figures:
        base = bare_cpu.get(f.producers)
        if f.cpu_ms is not None and base and not f.scenario.startswith("bare"):
            print(
                f"{f.scenario} with {f.producers} producer(s): {f.cpu_ms:.3f} ms server CPU per continuation, "
                f"{f.cpu_ms / base:.1f}x the bare endpoint's per two requests"
            )
    if rss is not None:
        print(
            f"serve RSS with {rss.active:,} active + {rss.tombstones:,} tombstones: {rss.rss_mib:.1f} MiB "
            f"(empty state {rss.empty_rss_mib:.1f} MiB; listening after {rss.open_seconds:.2f} s, "
            f"{rss.empty_open_seconds or 0:.2f} s on the empty state)"
        )


def figure_json(f: Figure) -> dict[str, Any]:
    """One measured scenario as JSON: its rate, latency percentiles and CPU per continuation."""
    lat = f.latencies_ms
    return {
        "scenario": f.scenario,
        "producers": f.producers,
        "n": f.n,
        "seconds": f.seconds,
        "rate": f.rate,
        "p50_ms": percentile(lat, 50) if lat else None,
        "p99_ms": percentile(lat, 99) if lat else None,
        "cpu_seconds": f.cpu_seconds,
        "cpu_ms_per_continuation": f.cpu_ms,
    }


def to_json(
    figures: list[Figure], rss: RssFigure | None, errors: dict[str, str], load: list[float]
) -> dict[str, Any]:
    rows = [figure_json(f) for f in figures]
    return {
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load, "loadavg_after": list(os.getloadavg())},
        "max_concurrent": MAX_CONCURRENT,
        "rows": rows,
        "ratios": ratios(figures),
        "rss": None if rss is None else vars(rss),
        "errors": errors,
    }


async def bench_rss(base: str, active: int, tombstones: int) -> RssFigure:
    """RSS of `afterword serve` on an empty state, then on one holding the given records."""
    with scratch_dir(base) as scratch:
        root = Path(scratch)
        config_path = write_config(root)
        config = json.loads(config_path.read_text())["continuations"]
        env = {**os.environ, TOKEN_ENV: TOKEN, "PYTHONPATH": str(REPO)}
        empty, empty_seconds = await serve_rss(config_path, config["port"], env, REPO)
        route = config["namedRoutes"][ROUTE]
        await anyio.to_thread.run_sync(
            fill_state, str(root / config["stateDir"]), active, tombstones, ROUTE, route["conversationId"]
        )
        full, seconds = await serve_rss(config_path, config["port"], env, REPO)
        return RssFigure(active, tombstones, empty, full, seconds, empty_seconds)


async def bench_dbos(base: str, n: int, inflight: int) -> Figure:
    with scratch_dir(base) as scratch:
        result = await anyio.to_thread.run_sync(run_dbos, scratch, n, WARMUP, inflight)
    if "error" in result:
        raise RuntimeError(result["error"])
    return Figure(f"dbos ({inflight} in flight)", inflight, n, result["seconds"], result["latencies_ms"])


async def main(args: argparse.Namespace) -> None:
    global MAX_CONCURRENT
    MAX_CONCURRENT = args.max_concurrent
    load = list(os.getloadavg())
    print(f"worker bound maxConcurrent={MAX_CONCURRENT}; {os.cpu_count()} CPUs; load average {load[0]:.2f}")
    base = scratch_base(args.scratch)
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    for producers in args.producers:
        n = args.n or (300 if producers == 1 else 2000)
        for scenario in args.scenarios:
            if scenario == "bare":
                figures.append(await bench_bare(producers, n))
            elif scenario == "detached" and args.baseline:
                # This checkout and the baseline in one run, alternating which goes first.
                trees: list[Path | None] = [Path(args.baseline).resolve(), None]
                order = trees if args.producers.index(producers) % 2 == 0 else trees[::-1]
                for tree in order:
                    figures.append(await bench_detached(base, producers, n, tree))
                    f = figures[-1]
                    print(
                        f"  {f.scenario}, {producers} producer(s): {f.rate:.1f} continuations/s", flush=True
                    )
                continue
            elif scenario == "detached":
                figures.append(await bench_detached(base, producers, n))
            elif scenario == "interactive":
                figures.append(await bench_interactive(base, producers, n))
            else:
                continue
            f = figures[-1]
            print(f"  {f.scenario}, {producers} producer(s): {f.rate:.1f} continuations/s", flush=True)
    if "dbos" in args.scenarios:
        try:
            f = await bench_dbos(base, args.n or 2000, args.dbos_inflight)
            figures.append(f)
            print(f"  {f.scenario}: {f.rate:.1f} workflows/s", flush=True)
        except Exception as exc:  # the peer is optional: say why it did not run
            errors["dbos"] = str(exc)
            print(f"  dbos: not measured: {exc}", flush=True)
    rss = None
    if "rss" in args.scenarios:
        rss = await bench_rss(base, args.rss_active, args.rss_tombstones)
    report(figures, rss)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(figures, rss, errors, load), indent=2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--n", type=int, default=0, help="continuations per measurement (default 300 / 2000)")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=["bare", "detached", "interactive"],
        choices=["bare", "detached", "interactive", "dbos", "rss"],
        help="dbos: the DBOS Transact peer (the bench extra); rss: serve's memory with many records",
    )
    parser.add_argument(
        "--baseline",
        help="a source tree (git archive of an older commit): detached runs its serve too, alternating",
    )
    parser.add_argument("--dbos-inflight", type=int, default=64, help="DBOS workflows in flight")
    parser.add_argument("--rss-active", type=int, default=10_000, help="active continuations for rss")
    parser.add_argument("--rss-tombstones", type=int, default=50_000, help="tombstones for rss")
    parser.add_argument(
        "--json", type=output_path, help="also write every figure, ratio and the machine's load here"
    )
    parser.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT, help="continuations.limits")
    parser.add_argument("--scratch", help="directory for scratch state (default: beside the repository)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse())
