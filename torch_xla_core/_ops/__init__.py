"""aten -> core op mapping: the ops layer (ARCHITECTURE.md, "Layers"). Each
op family module here (FAMILIES) registers handlers for its aten overloads
with the registry (registry.py: mapping() for an overload that is one core
op, a table row with no handler to write; @impl for a Python handler;
decomposed(), impl_by_name()). table.py holds the dispatch table
(HANDLERS); resolution.py gives every other overload its handler on first
use (in-place and out= variants derived from the functional handler,
torch's decompositions, a CPU fallback counted in metrics) and is what the
C++ dispatcher asks (entry). This module re-exports what the op modules
import from the package (`from . import aten, impl, mapping, ...`) and
loads the families."""
import importlib

from .._runtime.dtypes import code
from . import dtype_rules
from .registry import ANY, XLA, Arg, DECOMPOSED, Rest, decomposed, impl, impl_by_name, mapping
from .resolution import (BY_NAME_HANDLER, COMPOSITE, DECOMPOSITION, DERIVED, FALLBACK, assign, call, check_fill,
                         check_no_partial_overlap, check_writes, convert, entry, fallback, full, full_like,
                         functional_of, handler, install_dispatch, out_variant, route, sizes, type_name)
from .table import HANDLERS, aten, declared

# The op families: each module registers its handlers when imported.
FAMILIES = ("elementwise", "reduce", "shape", "factory", "linalg", "nn", "index", "random", "conv", "rnn", "upsample",
            "moe", "foreach", "einsum", "linalg_lapack", "special", "order", "misc", "nn_extra", "nn_grads",
            "transformer", "complex", "fft", "quantize")


def load_all():
    """Imports every op family (at import: _install.py). An import error
    surfaces: a missing module would otherwise turn its ops into CPU fallbacks."""
    for name in FAMILIES:
        importlib.import_module(f"{__name__}.{name}")
