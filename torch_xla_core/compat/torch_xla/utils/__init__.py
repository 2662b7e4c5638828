"""torch_xla.utils: utils (xu)."""
from . import utils  # noqa: F401
