"""Deprecated: moved to :mod:`afterword.cli.doctor`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .cli.doctor import *  # noqa: F403

warnings.warn(
    "afterword.doctor moved to afterword.cli.doctor; import it from there (afterword.doctor goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
