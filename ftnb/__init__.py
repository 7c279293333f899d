"""ftnb: fault-tolerant experiments for Jupyter.

Ray Tune's names (Tuner, RunConfig, FailureConfig, CheckpointConfig, Checkpoint, report,
get_checkpoint), with trials in their own processes that survive crashes, preemption and
restarts, and an experiment directory that is always the whole truth.
"""

from typing import Any

from .checkpoint import Checkpoint, CheckpointUploadMode
from .config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, TuneConfig
from .core.records import TrialStatus
from .lazy_names import lazy_attribute
from .result import Result, ResultGrid, TrialError
from .search import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from .session import TrialContext, get_checkpoint, get_context, get_dataset_shard, report
from .tuner import Tuner, run

__version__ = "0.1.0"

# Imported on first use, so that `import ftnb` stays fast: name -> module.
_LAZY = {
    "ExperimentHandle": "handle",
    "ExperimentLockedError": "storage.lease",
    "ExperimentNotFoundError": "handle",
    "LeaseLostError": "storage.lease",
    "NoBestResultError": "result",
    "ObjectRef": "objects",
    "RestoreError": "lifecycle.stored",
    "StorageUnavailableError": "storage",
    "SubEnvironments": "elastic",
    "Stopper": "stopper",
    "Callback": "callback",
    "ASHAScheduler": "schedulers",
    "AsyncHyperBandScheduler": "schedulers",
    "FIFOScheduler": "schedulers",
    "HyperBandScheduler": "schedulers",
    "MedianStoppingRule": "schedulers",
    "PB2": "schedulers",
    "PlacementGroupFactory": "execution.placement_groups",
    "PopulationBasedTraining": "schedulers",
    "ResourceChangingScheduler": "schedulers",
    "TrialScheduler": "schedulers",
    "LoggerCallback": "logger",
    "MLflowLoggerCallback": "air.integrations.mlflow",
    "TBXLoggerCallback": "logger",
    "WandbLoggerCallback": "air.integrations.wandb",
    "Trainable": "trainable_class",
    "CombinedStopper": "stopper",
    "ExperimentPlateauStopper": "stopper",
    "MaximumIterationStopper": "stopper",
    "TimeoutStopper": "stopper",
    "TrialPlateauStopper": "stopper",
    "TorchConfig": "train.torch_trainer",
    "TorchTrainer": "train.torch_trainer",
    "TrainingFailedError": "train.torch_trainer",
    "ValidationConfig": "train.validation",
    "ValidationTaskConfig": "train.validation",
    "WorkerGroup": "elastic",
    "WorkerGroupError": "elastic",
    "WorkerResult": "elastic",
    "attach": "handle",
    "get": "objects",
    "launch": "handle",
    "put": "objects",
    "with_parameters": "parameters",
    "with_resources": "parameters",
}


def __getattr__(name: str) -> Any:
    if name in ("torch", "stopper", "logger", "schedulers"):  # modules: ftnb.torch imports torch; ftnb.stopper as
        # Ray's tune.stopper
        import importlib

        value = importlib.import_module(f".{name}", __name__)
        globals()[name] = value
        return value
    return lazy_attribute(globals(), _LAZY, name)


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY) | {"torch", "stopper", "logger", "schedulers"})


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ftnb``: the ``%ftrun`` family of magics (``ftnb[notebook]``)."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "Callback",
    "Checkpoint",
    "CheckpointUploadMode",
    "CheckpointConfig",
    "ExperimentHandle",
    "ExperimentLockedError",
    "ExperimentNotFoundError",
    "FailureConfig",
    "FIFOScheduler",
    "HyperBandScheduler",
    "LeaseLostError",
    "LoggerCallback",
    "MLflowLoggerCallback",
    "MedianStoppingRule",
    "NoBestResultError",
    "ObjectRef",
    "PB2",
    "PlacementGroupFactory",
    "PopulationBasedTraining",
    "ResourceChangingScheduler",
    "RestoreError",
    "Result",
    "ResultGrid",
    "RunConfig",
    "ScalingConfig",
    "Stopper",
    "CombinedStopper",
    "ExperimentPlateauStopper",
    "MaximumIterationStopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
    "StorageUnavailableError",
    "SubEnvironments",
    "TBXLoggerCallback",
    "TorchConfig",
    "TrialScheduler",
    "Trainable",
    "TorchTrainer",
    "ValidationConfig",
    "ValidationTaskConfig",
    "TrainingFailedError",
    "TrialContext",
    "TrialError",
    "TrialStatus",
    "TuneConfig",
    "Tuner",
    "WandbLoggerCallback",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerResult",
    "__version__",
    "attach",
    "choice",
    "get",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "grid_search",
    "launch",
    "lograndint",
    "loguniform",
    "put",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "run",
    "sample_from",
    "uniform",
    "with_parameters",
    "with_resources",
]
