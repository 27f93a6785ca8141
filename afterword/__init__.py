"""afterword: durable continuations for AI agent hosts, on a write-ahead-log record store.

The app handle::

    async with afterword.open_service(afterword.load_config("afterword.json")) as service:
        binding = service.begin_run(run_id, conversation_id, reply_to)
        ...
"""

from typing import TYPE_CHECKING, Any

from .config import Config, ConfigError, default_config, load_config
from .continuations.errors import ServiceDisabled
from .errors import AfterwordError

if TYPE_CHECKING:
    from .app.service import ContinuationService, Resolution
    from .runtime import open_service

__version__ = "0.1.0"

__all__ = [
    "AfterwordError",
    "Config",
    "ConfigError",
    "ContinuationService",
    "Resolution",
    "ServiceDisabled",
    "__version__",
    "default_config",
    "load_config",
    "open_service",
]


def __getattr__(name: str) -> Any:
    # The service pulls in Quart and hypercorn; a tool server that only imports
    # afterword.producer should not pay for them.
    if name == "open_service":
        from .runtime import open_service

        return open_service
    if name in ("ContinuationService", "Resolution"):
        from .app import service

        return getattr(service, name)
    raise AttributeError(f"module 'afterword' has no attribute {name!r}")
