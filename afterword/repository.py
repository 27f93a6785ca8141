"""Deprecated: moved to :mod:`afterword.app.repository`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .app.repository import *  # noqa: F403

warnings.warn(
    "afterword.repository moved to afterword.app.repository; import it from there (afterword.repository goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
