"""The compat suite's setup, standalone: tests/compat/run.py copies this
folder (with tests/conformance, for the OpInfo slice) out of the source tree
and runs it in a venv per torch version where the built wheel is installed,
so `import torch_xla_core` finds the wheel, not the checkout. Inside the
checkout (pytest tests/compat) tests/conftest.py applies as well."""
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["TXC_COMPILE_CACHE"] = "off"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # conformance/

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402


@pytest.fixture
def dev():
    return txc.device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    txc.metrics.clear()
    txc._checks.clear()
