"""Deprecated: moved to :mod:`afterword.cli.serve`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .cli.serve import *  # noqa: F403

warnings.warn(
    "afterword.serve moved to afterword.cli.serve; import it from there (afterword.serve goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
