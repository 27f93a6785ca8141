"""Crash-injection runner for the afterword durability layer (``python -m tools.crashsim``).

Records a workload's disk operations through the ``Disk`` seam, builds the states a crash
could leave under an explicit persistence model, recovers each with the real code and checks
it; injects I/O errors the same way. See ``docs/crash-testing.md``.
"""

from .checkers import Violation
from .faults import FaultPlan, FaultyDisk
from .model import MODELS, PROCESS, REORDER, TORN, Model, get_model
from .recorder import Recorder, Recording
from .runner import Explorer, FaultResult, ModelResult, Scratch, Settings, explore, run_fault, run_faults
from .service_workloads import ContinuationLifecycle, LocalSynthesisLifecycle, OutboxLifecycle  # registers
from .states import CrashState, StateSpace, Tree
from .store_workloads import BlobLifecycle, CheckpointRecycling, StoreTransactions, StoreWorkload  # registers
from .workloads import WORKLOADS, Journal, Workload, get_workload, register

__all__ = [
    "MODELS",
    "PROCESS",
    "REORDER",
    "TORN",
    "WORKLOADS",
    "BlobLifecycle",
    "CheckpointRecycling",
    "ContinuationLifecycle",
    "CrashState",
    "Explorer",
    "FaultPlan",
    "FaultResult",
    "FaultyDisk",
    "Journal",
    "LocalSynthesisLifecycle",
    "Model",
    "ModelResult",
    "OutboxLifecycle",
    "Recorder",
    "Recording",
    "Scratch",
    "Settings",
    "StateSpace",
    "StoreTransactions",
    "StoreWorkload",
    "Tree",
    "Violation",
    "Workload",
    "explore",
    "get_model",
    "get_workload",
    "register",
    "run_fault",
    "run_faults",
]
