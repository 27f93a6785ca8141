"""Legacy state (v1 monolith, v2 records-v2): fail-closed reading, normalization, migration."""

from .formats import GUARD, GUARD_PATH, V1_FILE, V2_DIR, MigrationError
from .migrate import MigrationReport, RollbackGuard, install_rollback_guard, open_state

__all__ = [
    "GUARD",
    "GUARD_PATH",
    "V1_FILE",
    "V2_DIR",
    "MigrationError",
    "MigrationReport",
    "RollbackGuard",
    "install_rollback_guard",
    "open_state",
]
