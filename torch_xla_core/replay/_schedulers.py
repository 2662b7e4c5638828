"""LR schedulers inside a txc.compile step: torch's LRScheduler.step is
wrapped (install(), from _install.py) so that a step() inside a recording is
deferred to after the step's graph and run again after each replay (its
count and the lr it fills move on every call), and so that outside a
recording a device lr it filled holds its number's buffer (_bind_lrs)."""
import functools
import sys

import torch

from .._execution import executor
from .._tracing import tensor as _tensor
from ._recording import number_to_data

_scheduler_step = None  # torch's LRScheduler.step


def run(schedulers) -> None:
    """Steps each scheduler (torch's own step(), in order): a recording's,
    after the recorded call's graph and after each replay's."""
    for s in schedulers:
        _scheduler_step(s)


def install() -> None:
    """Routes LRScheduler.step() (without arguments, of a scheduler that does
    not override it, not called from another scheduler) to the recording
    session when one is under way; any other scheduler step inside a
    recording is refused (its lr would be baked into the graph)."""
    global _scheduler_step
    cls = torch.optim.lr_scheduler.LRScheduler
    if _scheduler_step is not None:
        return
    _scheduler_step = orig = cls.step

    @functools.wraps(orig)
    def step(self, *args, **kwargs):
        s = executor.recording_session()
        if s is None:
            r = orig(self, *args, **kwargs)
            _bind_lrs(self)
            return r
        caller = sys._getframe(1).f_locals.get("self")
        if args or kwargs or type(self).step is not step or isinstance(caller, cls):
            s.refuse(f"it steps an LR scheduler ({type(self).__name__}.step with arguments, or from another "
                     f"scheduler) whose new lr would be baked into the graph; step it outside the compiled "
                     f"function")
            return orig(self, *args, **kwargs)
        s.scheduler_step(self)
        return None

    cls.step = step


def _bind_lrs(sched) -> None:
    """After a scheduler's step outside a recording: a device lr it filled
    with a number (a lifted optimizer's: replay, torch.compile(opt.step))
    holds that number's buffer, and so does its copy in _last_lr; else the
    next sync computes them in a graph with the number in it (one compile
    per new value)."""
    last = getattr(sched, "_last_lr", None)
    for i, g in enumerate(sched.optimizer.param_groups):
        lr = g.get("lr")
        if type(lr) is _tensor.XlaTensor and not lr._lt.is_data and number_to_data(lr._lt):
            copy = last[i] if isinstance(last, list) and i < len(last) else None
            if type(copy) is _tensor.XlaTensor and not copy._lt.is_data and not copy.shape:
                copy._lt.assign(lr._lt)  # (the same immutable buffer: a later fill_ of either is its own)
