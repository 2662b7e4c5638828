"""Experimental features: scan and scan_layers (see torch_xla_core.scan)."""
from ..scan import scan, scan_layers  # noqa: F401

__all__ = ["scan", "scan_layers"]
