"""torch_xla.core: xla_model (xm) and xla_env_vars."""
from . import xla_env_vars, xla_model  # noqa: F401
