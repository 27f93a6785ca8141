"""SIGKILL `afterword serve` under a bounded loopback load and check nothing was lost or doubled."""

from .run import KillReport, run_killtest

__all__ = ["KillReport", "run_killtest"]
