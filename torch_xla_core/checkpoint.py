"""txc.checkpoint: step-numbered checkpoints of a training run, as Orbax's
CheckpointManager (complete or invisible, the last N kept, the latest found
on restart, saved in the background while training goes on).

The public face of torch_xla_core/_features/checkpoint.py (the implementation: read it there)."""
from ._features.checkpoint import CheckpointManager, ResumableLoader  # noqa: F401

__all__ = ["CheckpointManager", "ResumableLoader"]
