"""txc.compile: trace a step once, replay its recorded graph on later calls
with the same signature (the user's page, with what is guarded and what is
refused: docs/replay.md).

The public face of the package's files: _compiled.py (compile, Compiled:
recording and replaying a call), _walk.py (the step walk and its
signature), _session.py (what a recording sees while the step runs),
_recording.py (what a recording holds, inputs' buffers, what a replay
returns), _lift.py (optimizers' host state lifted to the device),
_schedulers.py (LR scheduler steps inside a step)."""
from ._compiled import MAX_RECORDINGS, MAX_VARIANTS, Compiled, compile  # noqa: A004
from ._lift import lift_optimizer  # noqa: F401  (txc.replay.lift_optimizer, as before; dynamo.py uses it)

__all__ = ["compile", "Compiled", "MAX_RECORDINGS", "MAX_VARIANTS"]
