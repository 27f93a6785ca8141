"""afterword: durable continuations for AI agent hosts, on a write-ahead-log record store.

The app handle::

    async with afterword.open_service(afterword.load_config("afterword.json")) as service:
        binding = service.begin_run(run_id, conversation_id, reply_to)
        ...
"""

from .config import Config, ConfigError, default_config, load_config
from .runtime import open_service
from .service import ContinuationService, Resolution

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "ContinuationService",
    "Resolution",
    "__version__",
    "default_config",
    "load_config",
    "open_service",
]
