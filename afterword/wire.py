"""Deprecated: moved to :mod:`afterword.protocol.wire`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .protocol.wire import *  # noqa: F403

warnings.warn(
    "afterword.wire moved to afterword.protocol.wire; import it from there (afterword.wire goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
