"""torch_xla.test: test_utils (xtu.mp_test)."""
from . import test_utils  # noqa: F401
