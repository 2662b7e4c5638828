"""Linear algebra on the device (torch_xla_core/_ops/linalg_lapack.py):
Cholesky, LU and the solves built on it, triangular solves, QR/Householder,
SVD, eigh, matrix_exp, pinv, lstsq, matrix_sqrth and polar (torch >= 2.14)
against CPU eager, batched and float64, gradients vs CPU, no CPU fallback, one jax_call node per factorization, the
deferred errors of cholesky/inv/solve and the `info` of the _ex variants, and
one compile for a repeated solve step."""
import pytest
import torch

import torch_xla_core as txc

DTYPES = (torch.float32, torch.float64)


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)


def _spd(*shape, dtype=torch.float32):
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _run(fn, *args, dev):
    """fn on the device (asserting no CPU fallback ran) and on the CPU."""
    before = dict(txc.metrics.fallbacks())
    out = fn(*[a.to(dev) if isinstance(a, torch.Tensor) else a for a in args])
    txc.sync(wait=True)
    new = {k: v for k, v in txc.metrics.fallbacks().items() if v != before.get(k, 0)}
    assert not new, f"CPU fallback ran: {new}"
    return out, fn(*args)


def _close(x, c, dtype):
    xs, cs = (x, c) if isinstance(c, (tuple, list)) else ((x,), (c,))
    assert len(xs) == len(cs)
    for a, b in zip(xs, cs):
        assert a.device.type == "xla"
        torch.testing.assert_close(a.cpu(), b, **_tol(dtype))


CASES = {
    "cholesky": (lambda a: torch.linalg.cholesky(a), lambda d: (_spd(3, 4, 4, dtype=d),)),
    "cholesky_upper_ex": (lambda a: torch.linalg.cholesky_ex(a, upper=True), lambda d: (_spd(4, 4, dtype=d),)),
    "cholesky_solve": (lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
                       lambda d: (torch.randn(2, 4, 3, dtype=d), _spd(2, 4, 4, dtype=d))),
    "cholesky_inverse": (lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a), upper=False),
                         lambda d: (_spd(4, 4, dtype=d),)),
    "lu_factor_ex": (torch.linalg.lu_factor_ex, lambda d: (torch.randn(2, 5, 5, dtype=d),)),
    "lu_rectangular": (torch.linalg.lu, lambda d: (torch.randn(2, 5, 3, dtype=d),)),
    "lu_unpack": (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), lambda d: (torch.randn(3, 4, 6, dtype=d),)),
    "lu_solve_adjoint_right": (
        lambda a, b: (torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True),
                      torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b.mT, left=False)),
        lambda d: (torch.randn(2, 4, 4, dtype=d), torch.randn(2, 4, 3, dtype=d))),
    "solve_broadcast": (torch.linalg.solve, lambda d: (torch.randn(5, 1, 3, 3, dtype=d), torch.randn(4, 3, 2, dtype=d))),
    "solve_vector_left_false": (lambda a, b: (torch.linalg.solve(a, b[..., 0]), torch.linalg.solve(a, b.mT, left=False)),
                                lambda d: (torch.randn(2, 3, 3, dtype=d), torch.randn(2, 3, 2, dtype=d))),
    "aten_det_solve_aux": (  # LU/pivots torch's backward formulas read (det/slogdet factor A^T if contiguous)
        lambda a, b: (*torch.ops.aten._linalg_det(a), *torch.ops.aten._linalg_slogdet(a),
                      *torch.ops.aten._linalg_solve_ex(a, b), *torch.ops.aten._linalg_det(a.mT)),
        lambda d: (torch.randn(3, 4, 4, dtype=d), torch.randn(3, 4, 2, dtype=d))),
    "inv": (torch.linalg.inv, lambda d: (torch.randn(3, 4, 4, dtype=d),)),
    "det_slogdet_logdet": (lambda a: (torch.linalg.det(a), *torch.linalg.slogdet(a), torch.logdet(a @ a.mT)),
                           lambda d: (torch.randn(3, 4, 4, dtype=d),)),
    "solve_triangular": (lambda a, b: (torch.linalg.solve_triangular(a, b, upper=True),
                                       torch.linalg.solve_triangular(a, b.mT, upper=False, left=False,
                                                                     unitriangular=True)),
                         lambda d: (torch.randn(2, 4, 4, dtype=d) + 4 * torch.eye(4, dtype=d),
                                    torch.randn(2, 4, 3, dtype=d))),
    "triangular_solve": (lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True),
                         lambda d: (torch.randn(4, 3, 2, dtype=d), torch.randn(5, 1, 3, 3, dtype=d) + 3 * torch.eye(3))),
    "qr_modes": (lambda a: (*torch.linalg.qr(a), *torch.linalg.qr(a, "complete"), *torch.linalg.qr(a, "r")),
                 lambda d: (torch.randn(2, 5, 3, dtype=d),)),
    "geqrf_householder_ormqr": (
        lambda a, c: (*torch.geqrf(a), torch.linalg.householder_product(*torch.geqrf(a)),
                      torch.ormqr(*torch.geqrf(a), c, left=True, transpose=True)),
        lambda d: (torch.randn(2, 5, 3, dtype=d), torch.randn(2, 5, 2, dtype=d))),
    "svd": (lambda a: (*torch.linalg.svd(a, full_matrices=False), torch.linalg.svdvals(a)),
            lambda d: (torch.randn(3, 5, 3, dtype=d),)),
    "eigh": (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda d: (torch.randn(2, 5, 5, dtype=d),)),
    "matrix_exp": (torch.linalg.matrix_exp, lambda d: (torch.randn(3, 4, 4, dtype=d) / 2,)),
    "pinv": (lambda a: (torch.linalg.pinv(a), torch.linalg.pinv(a @ a.mT, hermitian=True)),
             lambda d: (torch.randn(2, 5, 3, dtype=d),)),
    "lstsq_gelsd": (lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"),
                    lambda d: (torch.randn(2, 5, 3, dtype=d), torch.randn(2, 5, 2, dtype=d))),
    "matrix_rank_norms": (lambda a: (torch.linalg.matrix_rank(a), torch.linalg.matrix_norm(a, "nuc"),
                                     torch.linalg.matrix_norm(a, 2), torch.linalg.cond(a)),
                          lambda d: (torch.randn(2, 4, 4, dtype=d),)),
    "addbmm": (lambda c, a, b: torch.addbmm(c, a, b, beta=0.5, alpha=2),
               lambda d: (torch.randn(4, 2, dtype=d), torch.randn(3, 4, 5, dtype=d), torch.randn(3, 5, 2, dtype=d))),
    "empty": (lambda a, b: (*torch.linalg.cholesky_ex(a), torch.linalg.det(a), *torch.linalg.lu_factor_ex(b),
                            torch.linalg.svdvals(b)),
              lambda d: (torch.randn(2, 0, 0, dtype=d), torch.randn(0, 3, dtype=d))),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_cpu_without_fallback(name, dtype, dev):
    fn, make = CASES[name]
    x, c = _run(fn, *make(dtype), dev=dev)
    _close(x, c, dtype)


GRADS = {
    "cholesky": (lambda a: torch.linalg.cholesky(a @ a.mT + 4 * torch.eye(4, device=a.device)), (3, 4, 4)),
    "solve": (lambda a: torch.linalg.solve(a + 4 * torch.eye(4, device=a.device), a[..., :2]), (2, 4, 4)),
    "inv_det": (lambda a: (torch.linalg.inv(a + 4 * torch.eye(4, device=a.device)), torch.linalg.det(a)), (4, 4)),
    "qr": (lambda a: torch.linalg.qr(a), (2, 5, 3)),
    "svdvals_pinv": (lambda a: (torch.linalg.svdvals(a), torch.linalg.pinv(a)), (5, 3)),
    "eigh": (lambda a: torch.linalg.eigvalsh(a + a.mT), (2, 4, 4)),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], (2, 4, 4)),
    "matrix_exp": (lambda a: torch.linalg.matrix_exp(a / 2), (4, 4)),
    "solve_triangular": (lambda a: torch.linalg.solve_triangular(a + 4 * torch.eye(4, device=a.device), a,
                                                                upper=True), (4, 4)),
    "matrix_sqrth": (lambda a: torch.linalg.matrix_sqrth(a @ a.mT + 4 * torch.eye(4, device=a.device)), (2, 4, 4)),
    "polar": (lambda a: torch.linalg.polar(a), (2, 5, 3)),
}
NEW_IN_2_14 = pytest.mark.skipif(not hasattr(torch.linalg, "polar"),
                                 reason=f"torch 2.14 added linalg.matrix_sqrth and linalg.polar; this is "
                                        f"torch {torch.__version__}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", [pytest.param(n, marks=NEW_IN_2_14) if n in ("matrix_sqrth", "polar") else n
                                  for n in sorted(GRADS)])
def test_gradients_match_cpu(name, dtype, dev):
    fn, shape = GRADS[name]
    a = torch.randn(*shape, dtype=dtype)
    w = None
    grads = []
    before = dict(txc.metrics.fallbacks())
    for d in (dev, "cpu"):
        x = a.to(d).requires_grad_()
        outs = fn(x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if w is None:
            w = [torch.randn(o.shape, dtype=dtype) for o in outs]
        sum((o * wi.to(d)).sum() for o, wi in zip(outs, w)).backward()
        grads.append(x.grad)
    new = {k: v for k, v in txc.metrics.fallbacks().items() if v != before.get(k, 0)}
    assert not new, f"CPU fallback ran: {new}"
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else dict(atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(grads[0].cpu(), grads[1], **tol)


def test_one_jax_call_per_factorization(dev):
    a = _spd(4, 4).to(dev)
    text = txc.debug.stablehlo(torch.linalg.cholesky(a) * 2)
    assert text.count("func.call") == 1
    assert "potrf" in text            # the LAPACK kernel as a custom call, no host callback
    assert "callback" not in text


@NEW_IN_2_14
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matrix_sqrth_and_polar_match_cpu_without_fallback(dtype, dev):
    """torch 2.14's linalg.matrix_sqrth (eigh: V sqrt(max(w, 0)) V^H, the lower
    triangle read) and linalg.polar (the thin SVD: U = W Vh, H = Vh^H S Vh)
    against CPU eager and float64 by definition: X X = A, U^H U = I, U H = B."""
    a = _spd(2, 4, 4, dtype=dtype)
    a[1, 0, 3] = 9.0                                 # above the diagonal: not read
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=dtype)  # eigenvalue -1 counts as 0
    b = torch.randn(2, 5, 3, dtype=dtype)
    (x, xi, u, h), c = _run(lambda a, i, b: (torch.linalg.matrix_sqrth(a), torch.linalg.matrix_sqrth(i),
                                             *torch.linalg.polar(b)), a, indefinite, b, dev=dev)
    _close((x, xi, u, h), c, dtype)
    x, u, h = x.cpu().double(), u.cpu().double(), h.cpu().double()
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(x @ x, a.double().tril() + a.double().tril(-1).mT, **tol)
    torch.testing.assert_close(u.mT @ u, torch.eye(3, dtype=torch.float64).expand(2, 3, 3), **tol)
    torch.testing.assert_close(u @ h, b.double(), **tol)
    with pytest.raises(RuntimeError, match="linalg.polar: input must have at least as many rows as columns"):
        torch.linalg.polar(b.mT.to(dev))


def test_non_positive_definite_cholesky_raises_at_the_sync(dev):
    bad = torch.tensor([[4.0, 2.0, 1.0], [2.0, 3.0, 0.0], [1.0, 0.0, -5.0]])
    L = torch.linalg.cholesky(bad.to(dev))           # traced: the device has not looked yet
    with pytest.raises(torch.linalg.LinAlgError, match=r"linalg.cholesky: .*not positive-definite"):
        L.cpu()
    txc.sync(wait=True)                              # reported once
    L = torch.linalg.cholesky(bad.to(dev), upper=True)
    with pytest.raises(torch.linalg.LinAlgError, match=r"linalg.cholesky: .*not positive-definite"):
        L.cpu()


@pytest.mark.skipif(not hasattr(torch.ops.aten, "cholesky"),
                    reason=f"torch 2.14 removed torch.cholesky (aten::cholesky); this is torch {torch.__version__}")
def test_non_positive_definite_deprecated_cholesky_raises_at_the_sync(dev):
    """torch.cholesky (aten::cholesky, torch 2.11-2.13) raises at the sync too, naming itself."""
    bad = torch.tensor([[4.0, 2.0, 1.0], [2.0, 3.0, 0.0], [1.0, 0.0, -5.0]])
    with pytest.raises(torch.linalg.LinAlgError, match=r"cholesky: .*not positive-definite"):
        torch.cholesky(bad.to(dev)).cpu()


def test_cholesky_ex_returns_lapacks_info_without_raising(dev):
    good = _spd(4, 4)
    bad = torch.tensor([[4.0, 2.0, 1.0], [2.0, 3.0, 0.0], [1.0, 0.0, -5.0]])
    batch = torch.stack([bad, good[:3, :3]])
    L, info = torch.linalg.cholesky_ex(batch.to(dev))
    Lc, infoc = torch.linalg.cholesky_ex(batch)
    assert info.dtype == torch.int32 and info.cpu().tolist() == infoc.tolist() == [3, 0]
    torch.testing.assert_close(L.cpu()[1], Lc[1])
    txc.sync(wait=True)                              # no deferred error


def test_singular_inv_and_solve_raise_but_ex_returns_info(dev):
    sing = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, -5.0]])
    inv, info = torch.linalg.inv_ex(sing.to(dev))
    _, infoc = torch.linalg.inv_ex(sing)
    assert info.item() == infoc.item() == 3
    LU, piv, info = torch.linalg.lu_factor_ex(sing.to(dev))
    LUc, pivc, infoc = torch.linalg.lu_factor_ex(sing)
    assert piv.dtype == torch.int32 and piv.cpu().tolist() == pivc.tolist()   # 1-based, like LAPACK
    assert info.item() == infoc.item()
    with pytest.raises(torch.linalg.LinAlgError, match=r"linalg.inv: .*singular"):
        torch.linalg.inv(sing.to(dev)).cpu()
    with pytest.raises(torch.linalg.LinAlgError, match=r"linalg.solve: .*singular"):
        torch.linalg.solve(sing.to(dev), torch.ones(3, 1).to(dev)).cpu()
    ok = torch.linalg.solve(_spd(3, 3).to(dev), torch.ones(3, 1).to(dev))
    assert torch.isfinite(ok.cpu()).all()            # later syncs work


def test_integer_input_is_refused_naming_the_op(dev):
    with pytest.raises(RuntimeError, match=r"linalg.cholesky: .*float32 or float64"):
        torch.ops.aten.linalg_cholesky_ex(torch.ones(3, 3, dtype=torch.int64).to(dev))
    with pytest.raises(RuntimeError, match=r"linalg.solve_triangular: .*same dtype"):
        torch.linalg.solve_triangular(torch.eye(3).to(dev), torch.ones(3, 1, dtype=torch.float64).to(dev),
                                      upper=True)


def test_repeated_solve_step_compiles_once(dev):
    txc.executor.clear_cache()
    compiles = txc.metrics.counters().get("compile", 0)
    w = torch.zeros(4, 2).to(dev)
    for step in range(4):
        a = (_spd(4, 4) + step).to(dev)
        b = torch.randn(4, 2).to(dev)
        w = w + torch.linalg.solve(a, b) + torch.linalg.cholesky(a).sum()
        txc.sync()
    w.cpu()
    assert txc.metrics.counters().get("compile", 0) - compiles == 1
