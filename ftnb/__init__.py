"""ftnb: fault-tolerant experiments for Jupyter.

Ray Tune's names (Tuner, RunConfig, FailureConfig, CheckpointConfig, Checkpoint, report,
get_checkpoint), with trials in their own processes that survive crashes, preemption and
restarts, and an experiment directory that is always the whole truth.
"""

from .checkpoint import Checkpoint
from .config import CheckpointConfig, FailureConfig, RunConfig, TuneConfig
from .lease import ExperimentLockedError, LeaseLostError
from .objects import ObjectRef, get, put
from .result import Result, ResultGrid, TrialError
from .search import choice, grid_search, loguniform, randint, sample_from, uniform
from .session import TrialContext, get_checkpoint, get_context, report
from .state import TrialStatus
from .restore import RestoreError
from .tuner import Tuner, run

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "ExperimentLockedError",
    "FailureConfig",
    "LeaseLostError",
    "ObjectRef",
    "RestoreError",
    "Result",
    "ResultGrid",
    "RunConfig",
    "TrialContext",
    "TrialError",
    "TrialStatus",
    "TuneConfig",
    "Tuner",
    "__version__",
    "choice",
    "get",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "loguniform",
    "put",
    "randint",
    "report",
    "run",
    "sample_from",
    "uniform",
]
