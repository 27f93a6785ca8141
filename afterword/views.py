"""Deprecated: moved to :mod:`afterword.protocol.views`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .protocol.views import *  # noqa: F403

warnings.warn(
    "afterword.views moved to afterword.protocol.views; import it from there (afterword.views goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
