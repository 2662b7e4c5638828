"""Every ```python example of README.md and the docs site's pages (docs/*.md)
runs (issue 40), on the CPU, in the README's test command. Sybil parses the
pages; each page's examples run in order in one namespace, as a reader
types them. An example that needs a GPU, a TPU or several processes is
marked just above its block with Sybil's skip comment,

    <!-- skip: next "not run: needs several processes (torchrun)" -->

and docs/conf.py shows that reason on the built page. One reason is not a
skip: "run in a child process with N CPU devices" runs the block (it must
import what it uses) in a fresh interpreter with TXC_NUM_CPU_DEVICES=N, as
the device count is fixed when this process's runtime starts. A page whose
examples are all skipped is reported as skipped with their reasons."""
import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest
import torch
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from torch_xla_core import recompiles

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


CHILD = re.compile(r"run in a child process with (\d+) CPU devices")


def _where(page: Path):
    return page.relative_to(ROOT) if page.is_relative_to(ROOT) else page


def _run_in_child(source: str, devices: int) -> str:
    """The block's stderr tail if it fails in a fresh interpreter with `devices` CPU devices, else ''."""
    env = dict(os.environ, PJRT_DEVICE="CPU", TXC_NUM_CPU_DEVICES=str(devices), TXC_COMPILE_CACHE="off")
    p = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=600)
    return "" if p.returncode == 0 else p.stderr[-3000:]


def _run(page: Path) -> tuple[int, list[str]]:
    """(examples run, reasons of those skipped); raises at the first failing one."""
    ran, skipped = 0, []
    for example in SYBIL.parse(page):
        try:
            example.evaluate()
        except unittest.SkipTest as e:
            child = CHILD.match(str(e))
            if not child:
                skipped.append(f"line {example.line}: {e}")
                continue
            err = _run_in_child(str(example.parsed), int(child.group(1)))
            if err:
                raise AssertionError(f"{_where(page)}, the example at line {example.line} fails in its child "
                                     f"process:\n{err}") from None
        except Exception as e:
            raise AssertionError(f"{_where(page)}, the example at line {example.line} fails: "
                                 f"{type(e).__name__}: {e}") from e
        ran += example.region.evaluator is not None and not isinstance(example.parsed, tuple)
    return ran, skipped


@pytest.fixture
def _isolated(monkeypatch):
    """What a page turns on for its reader stays off for the next test in
    this process: recompile explanations (concepts.md), dynamo's caches
    (quickstart.md's torch.compile)."""
    monkeypatch.setattr(recompiles, "_forced", recompiles._forced)
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_examples_of_a_page_run(page, _isolated):
    ran, skipped = _run(page)
    if skipped and not ran:
        pytest.skip("every example needs what CI lacks: " + "; ".join(skipped))


def test_a_failing_example_fails_and_a_marked_one_is_skipped(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('```python\nx = 1 + 1\n```\n\n<!-- skip: next "needs a TPU" -->\n\n```python\n'
                    'raise RuntimeError("not run")\n```\n\n```python\nassert x == 3, x\n```\n')
    with pytest.raises(AssertionError, match=r"line 11 fails: AssertionError: 2"):
        _run(page)
    page.write_text(page.read_text().replace("x == 3", "x == 2"))
    assert _run(page) == (2, ['line 7: needs a TPU'])
    child = ('<!-- skip: next "run in a child process with 3 CPU devices" -->\n\n```python\n'
             'import torch_xla_core as txc\nassert txc.device_count() == {}, txc.device_count()\n```\n')
    page.write_text(child.format(3))
    assert _run(page) == (1, [])
    page.write_text(child.format(2))
    with pytest.raises(AssertionError, match=r"line 3 fails in its child process:\n(.|\n)*AssertionError: 3"):
        _run(page)


def test_readme_is_a_front_door_and_the_home_page_answers_the_first_questions():
    """Issue 40's targets: README.md at most 80 lines; the site's home page
    links, one click each, the flavor choice, replay and xm.optimizer_step,
    and those anchors exist on their pages (the docs build checks the links)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 80, f"README.md has {len(readme.splitlines())} lines; keep it <= 80"
    home = (ROOT / "docs" / "index.md").read_text()
    for link, heading in [("install.md#pick-a-flavor", ("install.md", "## Pick a flavor\n")),
                          ("replay.md", ("replay.md", "# txc.compile")),
                          ("porting.md#porting-xmoptimizer_step", ("porting.md", "### Porting xm.optimizer_step\n"))]:
        assert f"]({link})" in home, link
        assert heading[1] in (ROOT / "docs" / heading[0]).read_text(), heading


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """What `nox -s docs` runs (CI builds the site here): Sphinx over docs/ with
    warnings as errors and nitpicky references, every page read again; the
    generated parts (API reference from the docstrings, the settings table)
    are checked by docs/conf.py, which fails the build on a public name
    without a docstring or a stale table. The HTML has its search index."""
    out = tmp_path / "html"
    r = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html",
                        str(ROOT / "docs"), str(out), "-d", str(tmp_path / "doctrees")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for page in ("index", "install", "quickstart", "porting", "api/index", "settings", "search"):
        assert (out / f"{page}.html").is_file(), page
    assert (out / "searchindex.js").stat().st_size > 10_000
