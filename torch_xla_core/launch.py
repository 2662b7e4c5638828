"""Starts a training script in several processes on this machine: a thin
front over torchrun (torch.distributed.run, run in this process: its agent
starts the workers, watches them, stops or restarts the group when one
fails), with everything bound to the loopback address:

    python -m torch_xla_core.launch --nproc 2 [--devices 2] [--max-restarts 1] train.py [args...]

The public face of torch_xla_core/_features/launch.py (the implementation: read it there)."""
from ._features.launch import launch, main  # noqa: F401

__all__ = ["launch", "main"]

if __name__ == "__main__":  # python -m torch_xla_core.launch
    import sys

    sys.exit(main())
