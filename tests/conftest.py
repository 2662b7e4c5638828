import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
# No state shared through a home directory, and compile counts mean compiles:
# the persistent compile cache is off in tests (tests/test_compile_cache.py
# turns it on in a temporary directory).
os.environ["TXC_COMPILE_CACHE"] = "off"
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402

# summary, JSON and xdist for the OpInfo conformance suite (tests/conformance)
pytest_plugins = ("conformance.plugin",)


# pyproject's opt-in markers: a test marked with one runs only when `-m` names it
# (`pytest -m slow tests/test_replay_steps.py`); the default run skips it, saying how.
OPT_IN = ("slow", "packaging", "release")


def pytest_collection_modifyitems(config, items):
    chosen = config.getoption("-m") or ""
    for item in items:
        for marker in OPT_IN:
            if marker not in chosen and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=f"marked {marker}: runs with `pytest -m {marker}`"))


@pytest.fixture
def dev():
    return txc.device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    txc.metrics.clear()
    txc._checks.clear()  # a test that leaves a violated check must not fail the next one


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and our executable cache emptied around a test (the
    dynamo route's tests: pytestmark = pytest.mark.usefixtures("fresh_dynamo"))."""
    torch._dynamo.reset()
    txc.executor.clear_cache()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.compiled_autograd = False
