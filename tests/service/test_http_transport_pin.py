"""``afterword/http/transport.py`` is the one module that uses hypercorn's internals, against
the exact version pinned in pyproject.toml. An upgrade that moves or reshapes any of them
fails here, by name, before it fails as a subtle behaviour change in the HTTP tests."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
from importlib.metadata import version

import hypercorn.asyncio.lifespan
import hypercorn.asyncio.tcp_server
import hypercorn.protocol.h11

import afterword.http as http_package
from afterword.http.transport import _Connection, _Http11

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pinned() -> str:
    found = re.search(r'"hypercorn==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml must pin hypercorn exactly"
    return found.group(1)


def test_the_installed_hypercorn_is_the_pinned_one() -> None:
    assert version("hypercorn") == _pinned()


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_h11_protocol_internals_we_override_or_call_have_their_shape() -> None:
    h11p = hypercorn.protocol.h11.H11Protocol
    assert _params(h11p.__init__) == [
        "self", "app", "config", "context", "task_group", "connection_state", "ssl", "client", "server", "send",
    ]  # fmt: skip
    assert _params(h11p._check_protocol) == ["self", "event"]
    assert _params(h11p._send_error_response) == ["self", "status_code"]
    assert _params(h11p._send_h11_event) == ["self", "event"]
    # Where hypercorn switches to HTTP/2 is the method we silence, and only there.
    source = inspect.getsource(h11p)
    assert (
        source.count("raise H2CProtocolRequiredError") == 1
        and source.count("raise H2ProtocolAssumedError") == 1
    )
    check = inspect.getsource(h11p._check_protocol)
    assert "raise H2CProtocolRequiredError" in check and "raise H2ProtocolAssumedError" in check
    assert _Http11._check_protocol is not h11p._check_protocol


def test_the_tcp_server_internals_we_use_have_their_shape() -> None:
    tcp = hypercorn.asyncio.tcp_server.TCPServer
    assert _params(tcp.__init__) == ["self", "app", "loop", "config", "context", "state", "reader", "writer"]
    for name in ("_read_data", "_close", "_idle_timeout", "protocol_send", "_initiate_server_close"):
        assert callable(getattr(tcp, name)), name
    # Our run replaces the one that builds hypercorn's protocol switcher (ProtocolWrapper).
    assert "ProtocolWrapper(" in inspect.getsource(tcp.run)
    assert "ProtocolWrapper" not in inspect.getsource(_Connection.run)
    assert _params(hypercorn.asyncio.lifespan.Lifespan.__init__) == [
        "self",
        "app",
        "config",
        "loop",
        "lifespan_state",
    ]


def test_no_other_module_imports_hypercorn_internals() -> None:
    allowed = {"hypercorn.config"}
    offenders = []
    for path in pathlib.Path(http_package.__file__).parents[1].rglob("*.py"):
        if path.name == "transport.py" and path.parent.name == "http":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("hypercorn") and module not in allowed:
                offenders.append(f"{path.name}: {node.module}")
    assert offenders == []
