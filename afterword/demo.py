"""Deprecated: moved to :mod:`afterword.cli.demo`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from .cli.demo import *  # noqa: F403

warnings.warn(
    "afterword.demo moved to afterword.cli.demo; import it from there (afterword.demo goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
