"""The thin HTTP facade (Quart app + hypercorn on loopback)."""

from .app import create_app
from .server import HttpServer, ServeError

__all__ = ["HttpServer", "ServeError", "create_app"]
