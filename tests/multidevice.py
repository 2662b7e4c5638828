"""Running a test module on several CPU devices. The device count is fixed
when a process's runtime starts (TXC_NUM_CPU_DEVICES), and the rest of the
suite runs with one device, so a multi-device module runs itself once in a
child pytest process with TXC_NUM_CPU_DEVICES=N; each of its tests in the
parent then passes or fails with its own result from the child (the
child's failure text is shown).

    from multidevice import on_devices
    @on_devices(8)
    def test_something(): ...     # runs in the child, with 8 devices
"""
import functools
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

_results = {}  # (module file, n) -> {test name: None (passed) | failure text}


def _child_results(path: str, n: int) -> dict:
    key = (path, n)
    if key not in _results:
        with tempfile.TemporaryDirectory() as d:
            xml = os.path.join(d, "r.xml")
            env = dict(os.environ, TXC_NUM_CPU_DEVICES=str(n), TXC_TEST_WORKERS="0", PJRT_DEVICE="CPU")
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                path, f"--junitxml={xml}"], env=env, cwd=os.path.dirname(os.path.dirname(path)),
                               capture_output=True, text=True, timeout=900)
            out = {}
            if os.path.exists(xml):
                for case in ET.parse(xml).iter("testcase"):
                    bad = case.find("failure")
                    if bad is None:
                        bad = case.find("error")
                    skipped = case.find("skipped")
                    name = case.get("name").split("[")[0]
                    if bad is not None:
                        out[name] = (bad.get("message") or "") + "\n" + (bad.text or "")
                    elif skipped is not None:
                        out[name] = "skipped in the child: " + (skipped.get("message") or "")
                    else:
                        out.setdefault(name, None)
            out["__log__"] = p.stdout[-4000:] + p.stderr[-4000:]
            _results[key] = out
    return _results[key]


def on_devices(n: int):
    """Runs the test in a child process with n CPU devices (once per module)."""
    def deco(fn):
        @functools.wraps(fn)
        def test(*args, **kwargs):
            if os.environ.get("TXC_NUM_CPU_DEVICES") == str(n):
                return fn(*args, **kwargs)
            res = _child_results(os.path.abspath(sys.modules[fn.__module__].__file__), n)
            if fn.__name__ not in res:
                pytest.fail(f"{fn.__name__} did not run in the {n}-device child:\n{res['__log__']}", pytrace=False)
            if res[fn.__name__] is not None:
                pytest.fail(f"in the {n}-device child: {res[fn.__name__]}", pytrace=False)
        return test
    return deco
