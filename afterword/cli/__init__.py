"""The ``afterword`` command line, one module per command group: :mod:`.main` (parsing and
dispatch), :mod:`.continuations` (the operator's verbs), :mod:`.tasks`, :mod:`.serve`,
:mod:`.demo` and :mod:`.doctor`. The console script is ``afterword.cli:main``; ``python -m
afterword`` and ``python -m afterword.cli`` run the same function."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
