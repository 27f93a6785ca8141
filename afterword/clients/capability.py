"""The claim capability as a tool server receives it from its host.

A stdio server finds it in its environment, a loopback streamable-HTTP server in the headers
of each request (docs/design.md, Contracts: app handle); the names are in
:mod:`afterword.protocol.headers`. The token is checked to go only to a loopback ``http`` URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import urlsplit

from ..config.mcp import is_loopback_url
from ..protocol.headers import RESERVED_ENV, RESERVED_HEADERS
from .producer_errors import InvalidCapability

__all__ = ["ClaimCapability"]


@dataclass(frozen=True)
class ClaimCapability:
    """The request-bound claim capability as the host handed it to this server.

    ``mode`` tells the server how the answer will be used (``reply``, ``capture``, ...);
    ``fingerprint`` identifies the binding without revealing it. ``token`` is hidden from
    ``repr`` and must not be logged or shown to a model.
    """

    claim_url: str
    fingerprint: str
    mode: str
    token: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.token or not self.fingerprint or not self.mode:
            raise InvalidCapability("claim capability is incomplete (token, fingerprint and mode are needed)")
        if not is_loopback_url(self.claim_url) or urlsplit(self.claim_url).scheme != "http":
            raise InvalidCapability("claim URL is not a loopback http URL; refusing to send the token")

    @classmethod
    def _from_values(cls, values: list[str | None]) -> Self | None:
        if all(v is None for v in values):
            return None
        url, token, fp, mode = values
        if url is None or token is None or fp is None or mode is None:
            raise InvalidCapability("claim capability is incomplete (some reserved values are missing)")
        return cls(claim_url=url, token=token, fingerprint=fp, mode=mode)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self | None:
        """Read the capability of a stdio server from its environment; None when absent."""
        env = os.environ if environ is None else environ
        return cls._from_values([env.get(name) for name in RESERVED_ENV])

    @classmethod
    def from_headers(cls, headers: Mapping[str, str] | Any) -> Self | None:
        """Read the capability of a streamable-HTTP server from one request's headers.

        ``headers`` may be any mapping (names compared case-insensitively) or an object with
        ``items()`` such as Starlette's ``Headers``. Returns None when no reserved header is
        present.
        """
        lowered: dict[str, str] = {}
        for name, value in headers.items():
            key = name.lower()
            if key in RESERVED_HEADERS:
                if key in lowered and lowered[key] != value:
                    raise InvalidCapability(f"reserved header {key} is repeated with different values")
                lowered[key] = value
        return cls._from_values([lowered.get(name) for name in RESERVED_HEADERS])

    @classmethod
    def from_mcp_context(cls, ctx: Any, environ: Mapping[str, str] | None = None) -> Self | None:
        """The capability for the MCP request behind ``ctx``.

        ``ctx`` is what the server framework hands a tool: the ``Context`` of ``MCPServer``
        (SDK 2.x), of ``FastMCP`` (SDK 1.x) or of FastMCP 4, or the request context a
        low-level ``Server`` handler receives (either line). Over HTTP only that request's
        headers count, never the process environment, so one run's capability cannot leak
        into another run's request; over stdio the environment the host spawned this
        process with is the binding.
        """
        request = _request_of(ctx)
        if request is not None and hasattr(request, "headers"):
            return cls.from_headers(request.headers)
        return cls.from_env(environ)


def _request_of(ctx: Any) -> Any:
    """The transport request (an HTTP request, or None over stdio) behind a tool's context.

    The framework contexts wrap the SDK's request context in ``request_context``; a low-level
    handler is given that request context itself, which holds ``request`` directly. Outside a
    request ``MCPServer``'s context raises ``ValueError`` and FastMCP 4's returns None: no
    request, so no headers.
    """
    try:
        inner = getattr(ctx, "request_context", ctx)
    except ValueError:
        return None
    return getattr(inner, "request", None)
