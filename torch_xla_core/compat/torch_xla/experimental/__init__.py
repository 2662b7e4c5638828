"""torch_xla.experimental: scan and scan_layers; is_eager_mode() (always
False: torch_xla_core traces lazily and runs at sync, it has no eager mode)."""
from . import scan, scan_layers  # noqa: F401


def is_eager_mode() -> bool:
    """False: torch_xla_core has no eager mode (ops are traced and run at a sync)."""
    return False
