"""Deprecated: moved to :mod:`afterword.http.metrics`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .http.metrics import *  # noqa: F403

warnings.warn(
    "afterword.metrics moved to afterword.http.metrics; import it from there (afterword.metrics goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
