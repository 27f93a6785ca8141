"""The OpenAPI 3.1 document of the HTTP service, generated from the msgspec wire types.

Bodies come from :func:`msgspec.json.schema_components` over the same Structs the server
decodes and encodes, so a field added to a wire type is in the document without anyone
editing it. The operations themselves (credential, bodies, error statuses) are the table in
:mod:`afterword.http.operations`; ``tests/e2e/test_openapi.py`` checks that every route the app
registers is listed and that every listed status is actually produced.

``python -m afterword.http.openapi`` prints the document; the copy shipped beside this module
(``openapi.json``) is checked to equal it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import msgspec

from ..protocol.wire import ErrorBody
from .api_contract import ERRORS, SECURITY, Operation
from .operations import OPERATIONS
from .strictjson import MAX_JSON_DEPTH


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(op: Operation) -> dict[str, Any]:
    ref = "#/components/schemas/{}"
    doc: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    params: list[dict[str, Any]] = []
    for name in re.findall(r"\{(\w+)\}", op.path):
        params.append({"name": name, "in": "path", "required": True, "schema": {"type": "string"}})
    for name, schema in op.query:
        params.append({"name": name, "in": "query", "required": False, "schema": schema})
    for name, description in op.headers:
        params.append(
            {
                "name": name,
                "in": "header",
                "required": True,
                "description": description,
                "schema": {"type": "string", "minLength": 1},
            }
        )
    if params:
        doc["parameters"] = params
    if op.request is not None:
        doc["requestBody"] = {
            "required": not op.request_optional,
            "description": f"JSON; objects may not repeat a key, nesting at most {MAX_JSON_DEPTH} levels",
            "content": _json({"$ref": ref.format(op.request.__name__)}),
        }
    if op.response is None:
        ok: dict[str, Any] = {
            "description": "Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    elif op.response is dict:
        ok = {"description": "OpenAPI 3.1 document", "content": _json({"type": "object"})}
    else:
        ok = {"description": "OK", "content": _json({"$ref": ref.format(op.response.__name__)})}
    responses: dict[str, Any] = {"200": ok}
    for status in op.errors:
        responses[str(status)] = {"$ref": f"#/components/responses/E{status}"}
    doc["responses"] = responses
    doc["security"] = [{name: []} for name in (op.security, op.also_security) if name]
    return doc


def build_openapi() -> dict[str, Any]:
    """The document, as a JSON-ready dict."""
    types = sorted(
        {t for op in OPERATIONS for t in (op.request, op.response) if isinstance(t, type) and t is not dict}
        | {ErrorBody},
        key=lambda t: t.__name__,
    )
    _, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    statuses = sorted({s for op in OPERATIONS for s in op.errors})
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "afterword",
            "version": "1",
            "description": (
                "Durable continuations over loopback HTTP. Every error is the JSON envelope "
                '{"error": {"code", "message"}}. Besides the statuses listed per operation, any '
                "request may be answered 503 too_many_connections at the connection cap, and a "
                "request the HTTP parser cannot read 400 or 431 (see docs/http-hardening.md)."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                f"E{s}": {
                    "description": ERRORS[s],
                    "content": _json({"$ref": "#/components/schemas/ErrorBody"}),
                }
                for s in statuses
            },
            "securitySchemes": {
                name: {"type": "http", "scheme": "bearer", "description": text}
                for name, text in SECURITY.items()
            },
        },
    }


def openapi_bytes() -> bytes:
    return msgspec.json.format(msgspec.json.encode(build_openapi()), indent=2) + b"\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.buffer.write(openapi_bytes())
