"""torch_xla.core.xla_env_vars: the names of the environment variables torch_xla reads that mean
the same here (PJRT_DEVICE picks the platform; torch_xla_core/config.py declares it)."""
PJRT_DEVICE = "PJRT_DEVICE"
