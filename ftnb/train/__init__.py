"""Data-parallel training: :class:`TorchTrainer` runs ``train_loop_per_worker`` in a group of
ranks (one ``torch.distributed`` process group) that starts, fails and restarts as one unit."""

from ..checkpoint import Checkpoint, CheckpointUploadMode

__all__ = ["Checkpoint", "CheckpointUploadMode"]
