"""Deprecated: moved to :mod:`afterword.app.binding`; this name goes away in the next release.

Importing it warns once and re-exports the public names of the new module (docs/design.md,
"Moved modules").
"""

import warnings

from ..app.binding import *  # noqa: F403

# The service's record of an issued capability was called ClaimCapability here, the same name
# as the producer's public class; it is IssuedCapability now.
from ..app.binding import IssuedCapability

ClaimCapability = IssuedCapability

warnings.warn(
    "afterword.host.binding moved to afterword.app.binding; import it from there (afterword.host.binding goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
