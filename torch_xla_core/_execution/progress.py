"""The line on stderr while a long compile runs (executor.executable waits
with it)."""
import sys
import time

from .. import config


class Progress:
    """A line on stderr while a compile runs longer than TXC_COMPILE_PROGRESS
    seconds (default 2; 0 turns it off): which graph, how many ops, elapsed
    time; rewritten in place on a terminal, every 10 s otherwise."""

    def __init__(self, p):  # (an executor.Plan, or a fusion.ChainPlan)
        self.p, self.t0, self.shown = p, time.perf_counter(), None
        self.after = config.get("TXC_COMPILE_PROGRESS")

    def _line(self, elapsed, state):
        cut = self.p.cut  # (None for graphs compiled as one: _execution/fusion.py)
        what = f"{cut.num_nodes} ops, {cut.num_outputs} outputs" if cut is not None else f"{self.p.key.fused} graphs"
        return f"torch_xla_core: {state} graph {self.p.key.graph:016x} ({what}): {elapsed:.1f} s"

    def tick(self):
        elapsed = time.perf_counter() - self.t0
        if self.after <= 0 or elapsed < self.after:
            return
        tty = sys.stderr.isatty()
        if self.shown is None or (tty and elapsed - self.shown >= 0.5) or elapsed - self.shown >= 10:
            sys.stderr.write(("\r" if tty else "") + self._line(elapsed, "compiling") + ("" if tty else "\n"))
            sys.stderr.flush()
            self.shown = elapsed

    def done(self):
        if self.shown is not None:
            elapsed = time.perf_counter() - self.t0
            sys.stderr.write(("\r" if sys.stderr.isatty() else "") + self._line(elapsed, "compiled") + "\n")
            sys.stderr.flush()
