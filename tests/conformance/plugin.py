"""pytest plugin of the OpInfo conformance suite (registered by tests/conftest.py,
so that it also runs in pytest-xdist's controller, which collects nothing):

- a whole-suite run (`pytest tests`, or tests/conformance) is spread over
  pytest-xdist workers when xdist is installed and no -n was given:
  TXC_TEST_WORKERS (default: the usable CPUs, at most 8; 0 or 1: off);
- each conformance case attaches its record to its report (user_properties,
  which xdist carries to the controller); the terminal summary prints the
  counts (report.py) and TXC_CONFORMANCE_JSON=PATH writes every record;
  the bf16 training run's records (test_opinfo_bf16.py, modes "bf16" and
  "autocast") get their own report (report_bf16.py: pass rate, per-family
  accuracy against CPU), and TXC_BF16_REPORT=PATH writes them;
- TXC_TEST_CONFORMANCE_CACHE=DIR: the conformance cases compile through
  the persistent compile cache in DIR (the rest of the suite keeps it off:
  tests/conftest.py). CI sets it for the suite and for the conformance
  files on the other torches (tests/compat/run.py), which then load most
  executables instead of compiling them: a sample's StableHLO is mostly the
  same on every torch, and the cache's key holds the StableHLO, jaxlib, the
  device and our build, so only an identical program is reused.

Imports no torch: it is loaded by every pytest run under tests/.
"""
import json
import os
from pathlib import Path

import pytest

from . import report_bf16
from .report import render, summarize

KEY = "txc_conformance"
_HERE = Path(__file__).resolve().parent
_records = []


def _workers():
    n = os.environ.get("TXC_TEST_WORKERS", "auto")
    if n == "auto":
        return min(len(os.sched_getaffinity(0)), 8)
    return int(n)


def _whole_suite(config):
    for a in config.args:
        p = Path(a.split("::")[0]).resolve()
        if p == _HERE.parent or (p.is_dir() and p.is_relative_to(_HERE)):
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or getattr(config.option, "numprocesses", None) is not None
            or config.option.collectonly or getattr(config.option, "pdb", False)
            or not _whole_suite(config)):
        return
    n = _workers()
    if n > 1:
        config.option.numprocesses = n
        if config.option.dist == "no":
            # "load", keeping tests marked xdist_group together (tests/multidevice.py)
            config.option.dist = "loadgroup"


@pytest.fixture(autouse=True)
def _conformance_compile_cache(request, monkeypatch):
    cache = os.environ.get("TXC_TEST_CONFORMANCE_CACHE")
    if cache and Path(str(request.node.path)).is_relative_to(_HERE):
        monkeypatch.setenv("TXC_COMPILE_CACHE", cache)


def pytest_runtest_logreport(report):
    for key, rec in report.user_properties:
        if key == KEY and report.when == "call":
            _records.append(rec)


BF16_MODES = ("bf16", "autocast")


def pytest_terminal_summary(terminalreporter, config):
    if not _records or hasattr(config, "workerinput"):
        return
    f32 = [r for r in _records if r["mode"] not in BF16_MODES]
    bf16 = [r for r in _records if r["mode"] in BF16_MODES]
    if f32:
        mode = f32[0]["mode"]
        terminalreporter.write_sep("-", "OpInfo conformance")
        for line in render(summarize(f32), mode):
            terminalreporter.write_line(line)
        path = os.environ.get("TXC_CONFORMANCE_JSON")
        if path:
            Path(path).write_text(json.dumps({"mode": mode, "summary": summarize(f32), "cases": f32}, indent=1))
            terminalreporter.write_line(f"  records of {len(f32)} cases: {path}")
    if bf16:
        terminalreporter.write_sep("-", "OpInfo bf16 training conformance")
        summary = report_bf16.summarize(bf16)
        for line in report_bf16.render(summary):
            terminalreporter.write_line(line)
        path = os.environ.get("TXC_BF16_REPORT")
        if path:
            Path(path).write_text(json.dumps({"summary": summary, "cases": bf16}, indent=1))
            terminalreporter.write_line(f"  records of {len(bf16)} cases: {path}")
