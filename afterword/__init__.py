"""afterword: durable continuations for AI agent hosts, on a write-ahead-log record store."""

__version__ = "0.1.0"
