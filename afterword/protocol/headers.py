"""The names that carry credentials besides ``Authorization``, shared by the host, the server
and the producer helper.

A host hands each selected MCP server its claim capability in four reserved values: as
environment variables when it spawns a stdio server, or as request headers for a loopback
streamable-HTTP server. The host writes them last, over anything configured, and strips any
configured value that uses a reserved name. A detached service names itself in
:data:`SERVICE_NAME_HEADER` beside its bearer token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "RESERVED_ENV",
    "RESERVED_HEADERS",
    "SERVICE_NAME_HEADER",
    "sendable_header_name",
    "sendable_header_value",
    "strip_reserved_env",
    "strip_reserved_headers",
]

# Order matters: claim URL, token, fingerprint, mode (the producer reads them in this order).
RESERVED_ENV = (
    "MONO_AGENT_CONTINUATION_CLAIM_URL",
    "MONO_AGENT_CONTINUATION_CLAIM_TOKEN",
    "MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT",
    "MONO_AGENT_CONTINUATION_CLAIM_MODE",
)
RESERVED_HEADERS = (
    "x-mono-agent-continuation-claim-url",
    "x-mono-agent-continuation-claim-token",
    "x-mono-agent-continuation-claim-fingerprint",
    "x-mono-agent-continuation-claim-mode",
)
SERVICE_NAME_HEADER = "X-Mono-Agent-Service-Name"

# What an HTTP/1.1 client can put on the wire as a header (RFC 9110 token and field value),
# narrowed to ASCII: httpx encodes header text as ASCII, so anything else fails before a byte
# is sent. A value has no leading or trailing whitespace and no control character but tab.
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")


def sendable_header_name(name: str) -> bool:
    return _TOKEN.fullmatch(name) is not None


def sendable_header_value(value: str) -> bool:
    return _FIELD_VALUE.fullmatch(value) is not None


def strip_reserved_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` without the reserved variables (any case), so configuration cannot set them."""
    return {k: v for k, v in (env or {}).items() if k.upper() not in RESERVED_ENV}


def strip_reserved_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` without the reserved names (any case), so configuration cannot set them."""
    return {k: v for k, v in (headers or {}).items() if k.lower() not in RESERVED_HEADERS}
