"""The reviewed list of OpInfo cases that do not fully pass on the xla device.

Each entry names a case (OpInfo name[.variant], direction "fwd"/"bwd",
dtype or "*", mode "ci"/"full"/"all"), the outcomes its failing samples have
("error", "mismatch", "fallback"; several joined with "+") and why. The suite
is strict: a case whose set of failing outcomes differs from its entry's
(a new failure, a changed one, or an unexpected pass) fails, and so does an
entry naming an op, variant or dtype that OpInfo does not have.

Reasons, by kind:
  random        values come from a random stream: compared by shape only
  fallback      a data-dependent output shape: computed by a counted CPU fallback
  unsupported   the device refuses the dtype/op with a clear error
  fixed in branch X   being fixed elsewhere; refreshed after that merge
  bug: ...      a real defect (mismatches are always bugs unless random)
"""
from dataclasses import dataclass

KINDS = ("error", "fallback", "mismatch")


@dataclass(frozen=True)
class X:
    op: str
    direction: str
    fails: str
    reason: str
    dtype: str = "float32"
    mode: str = "all"

    def kinds(self):
        return tuple(sorted(self.fails.split("+")))


EXPECTED = [
]


def lookup(op, direction, dtype, mode):
    """The entry for a case, or None."""
    dt = str(dtype).removeprefix("torch.")
    hits = [x for x in EXPECTED if x.op == op and x.direction == direction
            and x.dtype in (dt, "*") and x.mode in (mode, "all")]
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} expected-failure entries match {op} {direction} {dt} {mode}: {hits}")
    return hits[0] if hits else None
