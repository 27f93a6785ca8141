"""Deprecated: moved to :mod:`afterword.clients.operator`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .clients.operator import *  # noqa: F403

warnings.warn(
    "afterword.operator moved to afterword.clients.operator; import it from there (afterword.operator goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
