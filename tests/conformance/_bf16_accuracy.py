"""Samples the bf16 run adds to OpInfo's own, where bf16 error grows with
the inputs (issue 37): attention with large scores (inputs scaled x1, x3,
x9: scaled scores of std up to 81, a score of 600 is 2 off in bf16), causal
and masked, grouped-query shapes; multi-head attention (both of its paths:
need_weights=False is SDPA, True is bmm + softmax); trilinear interpolation
on a grid large enough for its weights to round; addbmm/baddbmm with a long
contraction, beta and alpha (products that must round once).

Each runs as the OpInfo samples do (_bf16.run_sample), judged by its
largest errors (instead of the elementwise bound, which near-zero elements
of these long sums make rounding noise): every output's and gradient's
largest error against float64 is at most STRICT times CPU bf16's."""
import torch
from torch.testing._internal.opinfo.core import SampleInput

STRICT = 2.0
BF16 = torch.bfloat16


def _t(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(BF16).requires_grad_()


def _sdpa(g):
    for scale in (1, 3, 9):
        q, k, v = _t(g, 2, 4, 64, 32, scale=scale), _t(g, 2, 2, 64, 32, scale=scale), _t(g, 2, 2, 64, 32, scale=scale)
        yield SampleInput(q, args=(k, v), kwargs=dict(is_causal=True, enable_gqa=True))
        q, k, v = _t(g, 2, 4, 48, 32, scale=scale), _t(g, 2, 4, 64, 32, scale=scale), _t(g, 2, 4, 64, 32, scale=scale)
        mask = (torch.randn(48, 64, generator=g) * 2).to(BF16)
        yield SampleInput(q, args=(k, v), kwargs=dict(attn_mask=mask))
        bool_mask = torch.rand(2, 1, 48, 64, generator=g) > 0.3
        yield SampleInput(q, args=(k, v), kwargs=dict(attn_mask=bool_mask))


def _mha(g):
    e, heads = 32, 4
    for scale in (1, 3):
        for need_weights in (False, True):
            x = _t(g, 24, 2, e, scale=scale)  # [L, N, E]
            w, b = _t(g, 3 * e, e, scale=e ** -0.5), _t(g, 3 * e, scale=0.1)
            ow, ob = _t(g, e, e, scale=e ** -0.5), _t(g, e, scale=0.1)
            mask = (torch.randn(24, 24, generator=g)).to(BF16)
            yield SampleInput(x, args=(x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_(), e,
                                       heads, w, b, None, None, False, 0.0, ow, ob),
                              kwargs=dict(attn_mask=mask, training=True, need_weights=need_weights))


def _trilinear(g):
    for align in (False, True):
        yield SampleInput(_t(g, 2, 3, 6, 7, 8, scale=3), args=((11, 13, 9),),
                          kwargs=dict(mode="trilinear", align_corners=align))


def _bmm(batched):
    def samples(g):
        for beta, alpha in ((1, 1), (0.5, 2)):
            c = _t(g, *((8, 16, 24) if batched else (16, 24)), scale=3)
            yield SampleInput(c, args=(_t(g, 8, 16, 256, scale=3), _t(g, 8, 256, 24, scale=3)),
                              kwargs=dict(beta=beta, alpha=alpha))
    return samples


SAMPLES = {
    "nn.functional.scaled_dot_product_attention": _sdpa,
    "nn.functional.multi_head_attention_forward": _mha,
    "nn.functional.interpolate.trilinear": _trilinear,
    "addbmm": _bmm(False),
    "baddbmm": _bmm(True),
}


def samples(op_id):
    """The op's accuracy samples (bf16, inputs requiring grad), or none."""
    make = SAMPLES.get(op_id)
    return list(make(torch.Generator().manual_seed(37))) if make else []
