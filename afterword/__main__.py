"""``python -m afterword``: the same command as the ``afterword`` console script."""

import os
import signal
import sys


def _shadowing(entry: str) -> bool:
    folder = os.path.join(entry or os.curdir, "afterword")
    return os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, "__init__.py"))


def _unshadow() -> None:
    """Run from the directory that holds a clone named ``afterword``, Python finds the clone's
    folder first (the current directory leads ``sys.path``). It has no ``__init__.py``, so it
    becomes a namespace package named ``afterword`` before an editable install's finder, which
    Python asks only after the path, is ever reached; this module is then found inside a
    package with no ``__version__`` and nothing else. Forget that namespace and drop such
    folders from the path so that the import below reaches the installed package."""
    package = sys.modules.get("afterword")
    if package is None or getattr(package, "__file__", None) is not None:
        return
    sys.path[:] = [entry for entry in sys.path if not _shadowing(entry)]
    for name in [n for n in sys.modules if n == "afterword" or n.startswith("afterword.")]:
        del sys.modules[name]


_unshadow()

from afterword.cli.main import main  # noqa: E402 - after the path is clean

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
