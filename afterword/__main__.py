"""``python -m afterword``: the same command as the ``afterword`` console script."""

import signal
import sys

from .cli.main import main

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
