"""Deprecated: moved to :mod:`afterword.app.service`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .app.service import *  # noqa: F403

warnings.warn(
    "afterword.service moved to afterword.app.service; import it from there (afterword.service goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
