import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402

# summary, JSON and xdist for the OpInfo conformance suite (tests/conformance)
pytest_plugins = ("conformance.plugin",)


@pytest.fixture
def dev():
    return txc.device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    txc.metrics.clear()
    txc._checks.clear()  # a test that leaves a violated check must not fail the next one
