"""Data-parallel training: :class:`TorchTrainer` runs ``train_loop_per_worker`` in a group of
ranks (one ``torch.distributed`` process group) that starts, fails and restarts as one unit."""

from ..checkpoint import Checkpoint, CheckpointUploadMode

__all__ = ["Checkpoint", "CheckpointUploadMode", "ValidationConfig", "ValidationTaskConfig"]


def __getattr__(name: str) -> object:
    # Imported on first use (``import ftnb`` stays fast).
    if name in ("ValidationConfig", "ValidationTaskConfig"):
        from . import validation

        return getattr(validation, name)
    raise AttributeError(f"module 'ftnb.train' has no attribute {name!r}")
