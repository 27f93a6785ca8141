"""SIGKILL `afterword serve` under a bounded loopback load and check nothing was lost or doubled."""

from .run import PLANTS, run_killtest
from .verdict import KillReport, report_json

__all__ = ["PLANTS", "KillReport", "report_json", "run_killtest"]
