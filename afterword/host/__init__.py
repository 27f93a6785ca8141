"""Host side: run bindings and the request-bound claim capabilities they issue."""

from .binding import (
    RESERVED_ENV,
    RESERVED_HEADERS,
    ClaimCapability,
    RunBinding,
    strip_reserved_env,
    strip_reserved_headers,
)

__all__ = [
    "RESERVED_ENV",
    "RESERVED_HEADERS",
    "ClaimCapability",
    "RunBinding",
    "strip_reserved_env",
    "strip_reserved_headers",
]
