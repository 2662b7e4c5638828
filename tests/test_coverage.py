"""The coverage table (torch_xla_core/_ops/coverage.py, published as
docs/coverage.md): the doc equals what the dispatcher's resolution gives
today, and a row of each kind says what a call of that overload really does
(metrics' decomposition and fallback counters, the fallback's refusal)."""
import os
import re

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import _ops
from torch_xla_core._ops import coverage, dtype_rules

aten = torch.ops.aten


@pytest.fixture(scope="module")
def rows():
    return {r.name: r for r in coverage.table()}


def test_doc_is_current():
    if not os.path.exists(os.path.join(os.path.dirname(coverage.DOC), "..", "pyproject.toml")):
        pytest.skip("an installed package, not a checkout: docs/ is not shipped")
    with open(coverage.DOC) as f:
        doc = f.read()
    made_for = re.search(r"Generated for torch (\S+) ", doc).group(1)
    if made_for != coverage.torch_version():
        pytest.skip(f"docs/coverage.md lists torch {made_for}'s overloads; this is torch {coverage.torch_version()}")
    assert doc == coverage.render(coverage.table()), (
        "docs/coverage.md is out of date with the dispatch table: run python -m torch_xla_core._ops.coverage --write")


def test_each_kind_is_what_the_dispatcher_does(dev, rows):
    x = torch.tensor([[1.5, -2.25], [3.0, 0.5]])
    d = x.to(dev)
    assert rows["add.Tensor"].how == "mapping" and rows["add.Tensor"].detail.startswith("core op `add`")
    assert rows["lerp.Scalar"].how == "handler" and rows["lerp.Scalar"].refuses == "integer, bool (promoted)"
    assert rows["add.out"].how == "derived" and "`add.Tensor` (mapping)" in rows["add.out"].detail
    assert rows["frac"].how == "decomposition" and rows["frac"].refuses == "integer, bool"
    assert rows["unique_consecutive"].how == "fallback"
    assert rows["native_norm"].how == "refused"
    assert rows["rand"].how == "kernel" and rows["einsum"].how == "kernel"

    out = torch.empty(2, 2).to(dev)
    torch.add(d, d, out=out)
    torch.testing.assert_close(out.cpu(), x + x)
    torch.testing.assert_close(torch.frac(d).cpu(), torch.frac(x))
    assert txc.metrics.counter_value("decomposed::frac") == 1
    torch.testing.assert_close(torch.unique_consecutive(d).cpu(), torch.unique_consecutive(x))
    assert txc.metrics.counter_value("fallback::unique_consecutive") == 1
    assert not txc.metrics.counter_value("fallback::add.out") and not txc.metrics.counter_value("fallback::frac")
    with pytest.raises(NotImplementedError, match="aten::native_norm is not supported on the xla device"):
        torch.ops.aten.native_norm(d)


def test_decomposed_declarations_hold():
    """An op declared decomposed() (its dtype facts) has no handler, and
    torch's decomposition (or composite kernel) runs its functional overload."""
    assert _ops.DECOMPOSED
    for o in _ops.DECOMPOSED:
        fs = [getattr(o, n) for n in o.overloads()] if isinstance(o, torch._ops.OpOverloadPacket) else [o]
        for f in fs:
            assert not _ops.declared(f), f"{f} is declared decomposed() but has a handler"
        assert _ops.route(fs[0])[0] in (_ops.DECOMPOSITION, _ops.COMPOSITE), fs[0]  # (selu: elu's composite)
        assert dtype_rules.rule(fs[0]) is not None


def test_the_dtype_column_is_the_dispatchers_rule(rows):
    refusing = {n for n, r in rows.items() if r.refuses}
    assert {"celu", "celu_", "celu.out", "hypot", "hypot.out", "hypot_", "round.decimals", "addcmul"} <= refusing
    assert "round" not in refusing and "add.Tensor" not in refusing
    assert rows["addcmul"].refuses == "bool"


def test_cli_writes_the_doc(tmp_path, monkeypatch):
    doc = tmp_path / "coverage.md"
    monkeypatch.setattr(coverage, "DOC", str(doc))
    assert coverage.main(["--write"]) == 0
    assert doc.read_text() == coverage.render(coverage.table())
    assert os.path.basename(coverage.DOC) == "coverage.md"


def test_one_declaration_per_overload():
    """A second @impl or mapping() of an overload raises, naming both: which
    one ran depended on import order (aten.angle had two handlers, complex.py's
    and special.py's; moving an import made the real-only one win)."""
    before = _ops.HANDLERS[aten.lerp.Scalar], _ops.HANDLERS[aten.add.Tensor]
    with pytest.raises(ValueError, match=r"aten.lerp.Scalar: it already has a handler, .*elementwise.lerp"):
        _ops.impl(aten.lerp.Scalar)(lambda *a: None)
    with pytest.raises(ValueError, match=r"aten.add.Tensor: it already has a handler, .*elementwise.add"):
        _ops.impl(aten.add.Tensor)(lambda *a: None)  # (the handler of the calls add's mapping does not fit)
    with pytest.raises(ValueError, match="mapping of aten.add.Tensor: it is declared twice"):
        _ops.mapping(aten.add.Tensor, op="sub")
    assert (_ops.HANDLERS[aten.lerp.Scalar], _ops.HANDLERS[aten.add.Tensor]) == before
