"""torch_xla's API over torch_xla_core, reachable by changing import lines
only (docs/porting.md):

    import torch_xla_core.compat.torch_xla as torch_xla
    import torch_xla_core.compat.torch_xla.core.xla_model as xm
    import torch_xla_core.compat.torch_xla.distributed.spmd as xs

Each module is shaped as torch_xla's module of the same name, with its
signatures, semantics and units (metric times in nanoseconds, torch_xla's
metric names). It is the top layer of the package: it only renames and
adapts what the layers below do; nothing here adds an execution path."""
