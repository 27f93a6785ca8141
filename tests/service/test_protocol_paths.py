"""afterword/protocol/paths.py: the one place a URL path of the HTTP API is written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import afterword
from afterword.http.operations import OPERATIONS
from afterword.protocol import paths

TEMPLATES = {
    name: getattr(paths, name) for name in paths.__all__ if name.isupper() and name != "OPERATOR_PREFIX"
}
# A path of somebody else's API that a client of ours calls (Anthropic's Messages API).
FOREIGN = {("worker/synthesizers.py", "/v1/messages")}


def test_the_templates_are_exactly_the_documented_operations() -> None:
    assert set(TEMPLATES.values()) == {op.path for op in OPERATIONS}


def test_the_operator_prefix_covers_exactly_the_operator_capability_routes() -> None:
    # The transport keeps reserved connection slots for paths under this prefix (http/gate.py).
    operator = {op.path for op in OPERATIONS if op.path.startswith(paths.OPERATOR_PREFIX)}
    assert operator == {t for name, t in TEMPLATES.items() if "/operator/" in t} and len(operator) >= 8


def test_no_other_module_spells_a_v1_path() -> None:
    root = Path(afterword.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "protocol/paths.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("/v1")
            ):
                found.append((rel, node.value))
    assert [f for f in found if f not in FOREIGN] == []


def test_route_uses_the_quart_placeholder() -> None:
    assert paths.route(paths.RESULT) == "/v1/continuations/<cid>/result"
    assert paths.route(paths.CLAIM) == paths.CLAIM


def test_url_joins_the_base_and_encodes_the_id() -> None:
    assert paths.url(paths.CLAIM, "http://127.0.0.1:4319/") == "http://127.0.0.1:4319/v1/continuations/claim"
    assert paths.url(paths.STATUS, "http://h:1", cid="c_abc") == "http://h:1/v1/continuations/c_abc"
    # An id cannot reach another route or smuggle a query.
    assert paths.url(paths.RETRY, cid="../x?y#z/") == "/v1/operator/continuations/..%2Fx%3Fy%23z%2F/retry"


def test_url_encodes_a_run_id_too() -> None:
    assert paths.url(paths.HOST_CLOSE, run_id="r/1?x") == "/v1/host/runs/r%2F1%3Fx/close"


def test_url_refuses_a_template_whose_id_is_missing() -> None:
    with pytest.raises(ValueError, match="needs a continuation id"):
        paths.url(paths.SHOW, "http://h:1")
    with pytest.raises(ValueError, match="or run id"):
        paths.url(paths.HOST_RUN, cid="c_1")
