"""Every ```python example of README.md and the docs site's pages (docs/*.md)
runs (issue 40), on the CPU, in the README's test command. Sybil parses the
pages; each page's examples run in order in one namespace, as a reader
types them. An example that needs a GPU, a TPU or several processes is
marked just above its block with Sybil's skip comment,

    <!-- skip: next "needs several processes (torchrun)" -->

and docs/conf.py shows that reason on the built page. A page whose examples
are all skipped is reported as skipped with their reasons."""
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


def _run(page: Path) -> tuple[int, list[str]]:
    """(examples run, reasons of those skipped); raises at the first failing one."""
    ran, skipped = 0, []
    for example in SYBIL.parse(page):
        try:
            example.evaluate()
        except unittest.SkipTest as e:
            skipped.append(f"line {example.line}: {e}")
            continue
        except Exception as e:
            where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
            raise AssertionError(f"{where}, the example at line {example.line} fails: "
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
