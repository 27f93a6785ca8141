"""``afterword.mcp_host``: the documented public name of :mod:`afterword.clients.mcp_sessions`.

A stable alias, not a deprecated one: tool servers and hosts import this name (it is one of
the public contracts in docs/design.md), so it re-exports the same objects and stays without
a warning. The code lives in ``afterword/clients/mcp_sessions.py``.
"""

from .clients.mcp_sessions import *  # noqa: F403
from .clients.mcp_sessions import __all__ as __all__
