"""Deprecated: moved to :mod:`afterword.app.runtime`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .app.runtime import *  # noqa: F403

warnings.warn(
    "afterword.runtime moved to afterword.app.runtime; import it from there (afterword.runtime goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
