"""The layers of csrc/ (ARCHITECTURE.md, "Layers of csrc/"), checked from the sources.

Every file under csrc/ belongs to a layer by its folder; a file may include
(`#include "dir/file.h"`) only files of its own layer or of a lower one, and
only the Python layers may touch Python (pybind11, Python.h, PyObject):

    ir < lower < ops < trace < py, ext < top (module.cpp, build_info, bench/)

Reads the text only: no build needed.
"""
import pathlib
import re
import sys

import pytest

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"

# Folder -> rank. Two folders of one rank (py, ext) may not include each other.
RANK = {"ir": 0, "lower": 1, "ops": 2, "trace": 3, "py": 4, "ext": 4, "bench": 5, "": 5}
PYTHON_LAYERS = {"py", "ext", "bench", ""}  # "": csrc's own files (module.cpp, build_info)

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
# Python's C API or pybind11 used in code (comments and strings are removed first).
PY_TOKEN = re.compile(r"\b(pybind11::|py::|PyObject\b|Py_[A-Za-z]+|PYBIND11_[A-Z_]+)")
PY_HEADER = re.compile(r"^(pybind11/|Python\.h$|torch/(extension|python)\.h$)")


def sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".hpp", ".cc"))


def layer(path):
    rel = path.relative_to(CSRC)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def code_only(text):
    """The text without comments and string literals (lengths of lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' and not text[text.rfind("\n", 0, i) + 1:i].lstrip().startswith("#"):  # not an #include's
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'":
            j = i + 1
            while j < n and text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            out.append("''")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def violations():
    """(file, line, what) for each include or Python use the layers forbid."""
    bad = []
    for path in sources():
        rel = path.relative_to(CSRC).as_posix()
        own = layer(path)
        if own not in RANK:
            bad.append((rel, 0, f"folder csrc/{own}/ has no layer: add it to RANK and ARCHITECTURE.md"))
            continue
        text = code_only(path.read_text())
        for m in INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            quote, target = m.groups()
            if PY_HEADER.match(target):
                if own not in PYTHON_LAYERS:
                    bad.append((rel, line, f"includes <{target}>: Python stays in py/ (or ext/, module.cpp)"))
                continue
            if quote != '"':
                continue  # the standard library and other system headers
            if not (CSRC / target).is_file():
                bad.append((rel, line, f'includes "{target}", which is not a file under csrc/'))
                continue
            to = target.split("/")[0] if "/" in target else ""
            if to not in RANK:
                bad.append((rel, line, f'includes "{target}" of csrc/{to}/, which has no layer'))
            elif to != own and RANK[to] >= RANK[own]:
                bad.append((rel, line, f'includes "{target}": {to}/ is not below {own or "csrc"}/'))
        uses = list(PY_TOKEN.finditer(text)) if own not in PYTHON_LAYERS else []
        if uses:  # one line per file: the first use, and how many there are
            line = text.count("\n", 0, uses[0].start()) + 1
            bad.append((rel, line, f"uses {uses[0].group(1)} ({len(uses)} uses of Python's API or pybind11): "
                                   "Python stays in py/ (or ext/, module.cpp)"))
    return bad


def test_csrc_files_are_found():
    # The check reads real files: each layer has sources (a moved csrc/ would make it vacuous).
    found = {layer(p) for p in sources()}
    assert {"ir", "lower", "ops", "trace", "py", "ext", "bench", ""} <= found, found


def test_includes_go_down_and_python_stays_in_py():
    bad = violations()
    assert not bad, "csrc/ layer violations (ARCHITECTURE.md, 'Layers of csrc/'):\n" + "\n".join(
        f"  csrc/{f}:{line}: {what}" for f, line, what in bad)


def test_architecture_draws_these_layers():
    # ARCHITECTURE.md's drawing, top row first, names the same layers in the
    # same order as RANK: the drawing is what this check makes true.
    text = (CSRC.parent / "ARCHITECTURE.md").read_text()
    block = text.split("## Layers of csrc/", 1)[1].split("```")[1]
    rows = []
    for line in block.splitlines():
        names = ["" if n == "module.cpp" else n.rstrip("/")
                 for n in re.findall(r"(?<![\w/.])(module\.cpp|\w+/)(?![\w.])", line)]
        if names:
            rows.append(names)
    drawn = [n for row in rows for n in row]
    assert sorted(drawn) == sorted(RANK), (drawn, sorted(RANK))
    ranks = [{RANK[n] for n in row} for row in rows]
    assert all(len(r) == 1 for r in ranks), rows  # one rank per row
    ranks = [r.pop() for r in ranks]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks), rows


@pytest.mark.parametrize("snippet, own, expected", [
    ('#include "ops/registry.h"\n', "ir", 'includes "ops/registry.h": ops/ is not below ir/'),
    ('#include "py/lazy.h"\n', "ext", 'includes "py/lazy.h": py/ is not below ext/'),
    ("#include <pybind11/pybind11.h>\n", "trace", "includes <pybind11/pybind11.h>"),
    ("void f(py::object o);\n", "ops", "uses py::"),
    ("int g(PyObject* o);\n", "lower", "uses PyObject"),
])
def test_the_check_catches_a_crossing(tmp_path, monkeypatch, snippet, own, expected):
    # The check itself: a file with one forbidden line is reported (and nothing
    # else is), so a passing run means the tree has none.
    root = tmp_path / "csrc"
    for d in ("ir", "lower", "ops", "trace", "py", "ext", "bench"):
        (root / d).mkdir(parents=True)
    for f in ("ops/registry.h", "py/lazy.h"):
        (root / f).write_text("// a header\n")
    (root / own / "x.cpp").write_text("// a comment naming py::object and #include \"py/lazy.h\"\n" + snippet)
    monkeypatch.setattr(sys.modules[__name__], "CSRC", root)
    bad = violations()
    assert [b[0] for b in bad] == [f"{own}/x.cpp"], bad
    assert bad[0][1] == 2 and expected in bad[0][2], bad
