"""Deprecated: moved to :mod:`afterword.cli.tasks`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

# The stand-alone entry this module had: the main command takes the same arguments
# (``tasks list ...``).
from ..cli.main import main
from ..cli.tasks import *  # noqa: F403

warnings.warn(
    "afterword.tasks.cli moved to afterword.cli.tasks; import it from there (afterword.tasks.cli goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    import sys

    sys.exit(main())
