"""schemathesis against the live service, with real credentials for every route.

Two targets, each on a real loopback socket. ``embedded``: ``open_service`` (the HTTP stack
and worker ``afterword serve`` runs) on a thread of its own, so every credential is at hand,
including a run's claim capability, which exists only inside the serving process. ``serve``:
``afterword serve`` as a subprocess, with the credentials an outside process can hold (the
operator capability, the detached token, a result token); its claim route only ever sees an
unknown capability. schemathesis reads ``/v1/openapi.json`` from each and sends generated
valid and invalid requests to every operation with the credential that operation needs and,
for routes with a continuation id, a real one in the path.

Checked on every response: no 5xx, the status is documented for the operation, the content
type and body match the document, and every error is exactly the JSON envelope.

``AFTERWORD_SCHEMATHESIS_EXAMPLES`` sets the examples per operation and generation mode for
the embedded target (default 10; the subprocess gets half), about 30-60 s together here. A
longer run: ``AFTERWORD_SCHEMATHESIS_EXAMPLES=500 pytest tests/e2e/test_schemathesis.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import requests
import schemathesis
from _service import DETACHED_TOKEN, ENV, deadline, load, write_config
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

import afterword
from afterword.clients.operator import read_host_token, read_operator_token

EXAMPLES = int(os.environ.get("AFTERWORD_SCHEMATHESIS_EXAMPLES", "10"))
# A run bound over the host API, so its routes see a real run id in the path.
HOST_RUN = {"runId": "fuzz-host-run", "conversationId": "local:fuzz#1", "replyTo": "local:fuzz"}
pytestmark = pytest.mark.timeout(max(600, EXAMPLES * 8))  # a long run needs longer


class Live:
    """The service on its own thread and event loop, with one credential of each kind."""

    def __init__(self, root: Path) -> None:
        self.config = load(write_config(root))
        self.base = self.config.base_url
        self.tokens: dict[str, str] = {}
        self.cid = ""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Live:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or not self._ready.is_set():
            raise RuntimeError(f"service did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:  # surfaced by __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        async with afterword.open_service(self.config, environ=ENV) as service:
            binding = service.begin_run("fuzz-run", "local:fuzz#1", "local:fuzz")
            self.tokens["claimCapability"] = binding.stdio_env("work-control")[
                "MONO_AGENT_CONTINUATION_CLAIM_TOKEN"
            ]
            self.tokens["operatorCapability"] = read_operator_token(self.config)
            self.tokens["detachedToken"] = DETACHED_TOKEN
            async with httpx.AsyncClient(trust_env=False) as client:
                r = await client.post(
                    service.claim_url,
                    headers={"Authorization": f"Bearer {self.tokens['claimCapability']}"},
                    json={"taskKey": "seed", "taskHash": "a" * 64, "deadline": deadline()},
                )
                r.raise_for_status()
            self.cid = r.json()["continuationId"]
            self.tokens["resultToken"] = r.json()["resultToken"]
            self.tokens["hostCapability"] = read_host_token(self.config)
            async with httpx.AsyncClient(trust_env=False) as client:
                begin = await client.post(
                    self.base + "/v1/host/runs",
                    headers={"Authorization": f"Bearer {self.tokens['hostCapability']}"},
                    json=HOST_RUN,
                )
                begin.raise_for_status()
            self._ready.set()
            await anyio.to_thread.run_sync(self._stop.wait)


class Served:
    """``afterword serve`` as a subprocess, with the credentials an outside process can hold:
    the operator capability (from the owner-only secret), the detached token and the result
    token of a detached claim. No run exists outside the serving process, so the claim route
    sees a well-formed but unknown claim capability."""

    def __init__(self, root: Path) -> None:
        self.path = write_config(root)
        self.config = load(self.path)
        self.base = self.config.base_url
        self.tokens: dict[str, str] = {
            "claimCapability": "awc1.no-such-run.AAAA",
            "detachedToken": DETACHED_TOKEN,
        }
        self.cid = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Served:
        env = {**os.environ, **ENV}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "afterword.cli", "serve", "--config", str(self.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        with httpx.Client(trust_env=False, timeout=5) as client:
            end = time.monotonic() + 30
            while True:
                try:
                    client.get(self.base + "/v1/openapi.json")
                    break
                except httpx.HTTPError:
                    if time.monotonic() > end or self._proc.poll() is not None:
                        raise RuntimeError("afterword serve did not start") from None
                    time.sleep(0.05)
            self.tokens["operatorCapability"] = read_operator_token(self.config)
            r = client.post(
                self.base + "/v1/continuations/detached/claim",
                headers={
                    "Authorization": f"Bearer {DETACHED_TOKEN}",
                    "X-Mono-Agent-Service-Name": "work-control",
                },
                json={
                    "route": "verification",
                    "taskKey": "seed",
                    "taskHash": "a" * 64,
                    "deadline": deadline(),
                },
            )
            r.raise_for_status()
            self.tokens["hostCapability"] = read_host_token(self.config)
            client.post(
                self.base + "/v1/host/runs",
                headers={"Authorization": f"Bearer {self.tokens['hostCapability']}"},
                json=HOST_RUN,
            ).raise_for_status()
        self.cid = r.json()["continuationId"]
        self.tokens["resultToken"] = r.json()["resultToken"]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.terminate()
        self._proc.wait(30)


@pytest.fixture(scope="module", params=["embedded", "serve"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live | Served]:
    root = tmp_path_factory.mktemp(f"schemathesis-{request.param}")
    with Live(root) if request.param == "embedded" else Served(root) as service:
        yield service


def error_envelope(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx is exactly ``{"error": {"code": str, "message": str}}``."""
    if response.status_code < 400:
        return None
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message"}, body
    assert isinstance(error["code"], str) and error["code"], body
    assert isinstance(error["message"], str) and error["message"], body
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    error_envelope,
]


def _fuzz(
    strategy: Any, headers: dict[str, str], statuses: dict[int, int], session: requests.Session, examples: int
) -> int:
    """Run one operation's strategy; returns how many requests were sent."""
    sent = 0

    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=True,
        phases=[Phase.generate],
    )
    def run(case: Any) -> None:
        nonlocal sent
        response = case.call(headers=headers, timeout=10, session=session)
        sent += 1
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()
    return sent


@pytest.mark.slow
def test_api_conforms_to_its_document(live: Live | Served, capsys: pytest.CaptureFixture[str]) -> None:
    schema = schemathesis.openapi.from_url(live.base + "/v1/openapi.json")
    examples = EXAMPLES if isinstance(live, Live) else max(1, EXAMPLES // 2)
    session = requests.Session()
    session.trust_env = False  # the credentials go to the loopback service only
    counts: dict[str, int] = {}
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        raw = operation.definition.raw
        security = [name for requirement in raw.get("security") or [] for name in requirement]
        headers = {"Authorization": f"Bearer {live.tokens[security[0]]}"} if security else {}
        fixed: dict[str, Any] = {}
        if "{cid}" in operation.path:
            fixed["path_parameters"] = {"cid": live.cid}
        if "{runId}" in operation.path:
            fixed["path_parameters"] = {"runId": HOST_RUN["runId"]}
        if any(p.get("name") == "X-Mono-Agent-Service-Name" for p in raw.get("parameters", [])):
            fixed["headers"] = {"X-Mono-Agent-Service-Name": "work-control"}
        # An operation with no parameter, body or credential (GET /v1/livez) has nothing a
        # negative case could get wrong.
        negatable = bool(raw.get("parameters") or raw.get("requestBody") or security)
        modes = (
            (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if negatable else (GenerationMode.POSITIVE,)
        )
        # The host API's routes share their decoding and errors with the rest: fewer examples
        # each keep the suite's time in bounds (AFTERWORD_SCHEMATHESIS_EXAMPLES raises both).
        per_op = max(1, examples // 2) if operation.path.startswith("/v1/host/") else examples
        for mode in modes:
            label = f"{operation.label} {mode.value}"
            try:
                counts[label] = _fuzz(
                    operation.as_strategy(mode, **fixed), headers, statuses, session, per_op
                )
            except Unsatisfiable:
                # Nothing of this operation can be made invalid (no body, parameters fixed).
                assert mode is GenerationMode.NEGATIVE, label
                counts[label] = -1
    with capsys.disabled():
        print(
            f"\nschemathesis ({type(live).__name__}): {sum(v for v in counts.values() if v > 0)} requests over {len(counts)} operation/mode pairs;"
            f" statuses {dict(sorted(statuses.items()))}"
        )
    assert all(counts.values()), counts
    print("unsatisfiable (nothing to negate):", [k for k, v in counts.items() if v < 0])
    assert not [s for s in statuses if s >= 500], statuses
