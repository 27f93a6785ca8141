"""The thin HTTP facade (Quart app + hypercorn on loopback)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app
    from .server import HttpServer, ServeError

__all__ = ["HttpServer", "ServeError", "create_app"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, not when the package is imported: ``python -m
    # afterword.http.openapi`` imports this package first, and an eager import of ``.app``
    # (which imports ``.openapi``) would load that module twice, once as ``__main__``, and
    # make runpy warn.
    if name == "create_app":
        from .app import create_app

        return create_app
    if name in ("HttpServer", "ServeError"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'afterword.http' has no attribute {name!r}")
