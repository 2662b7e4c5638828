"""scan_decoder_layers on transformers models as users get them: a tiny
LlamaForCausalLM trained 3 AdamW steps scanned and unrolled gives the same
losses and parameters; the scanned step's StableHLO holds one loop per
direction whatever the number of layers; the calls that cannot be scanned
(a KV cache being filled, per-layer outputs) run the unrolled loop and give
the model's own results; models whose layers or loop differ are refused,
naming why."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import torch_xla_core as txc
from torch_xla_core._features.hf_scan import ScannedLayers
from torch_xla_core.scan import scan_decoder_layers

T = pytest.importorskip("transformers")

V = 96
_S = dict(vocab_size=V, hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)


def llama(n=3, **kw):
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(**_S, num_hidden_layers=n, num_key_value_heads=2, **kw))


def counters():
    return dict(txc.metrics.counters())


def delta(before, name):
    return counters().get(name, 0) - before.get(name, 0)


def train(model, ids, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        txc.sync()
        losses.append(loss.detach().cpu())
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


def test_scanned_llama_trains_like_unrolled(dev):
    base = llama(3)  # default config: use_cache=True
    ids = torch.randint(0, V, (2, 16)).to(dev)
    ref_losses, ref_params = train(copy.deepcopy(base).to(dev), ids)
    model = copy.deepcopy(base).to(dev)
    layers = model.model.layers
    assert scan_decoder_layers(model) is model and isinstance(layers, ScannedLayers)
    before = counters()
    with pytest.warns(UserWarning, match="use_cache=True is set to False"):
        losses, params = train(model, ids)
    assert delta(before, "scan_hf_scanned") == 3 and delta(before, "scan_hf_unrolled") == 0
    torch.testing.assert_close(losses, ref_losses, atol=1e-5, rtol=1e-5)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(p, r, atol=1e-5, rtol=1e-5)
    # the same ModuleList object and modules: state_dict keys and optimizer references unchanged
    assert model.model.layers is layers and list(model.state_dict()) == list(base.state_dict())
    assert [type(m) for m in model.model.layers] == [T.models.llama.modeling_llama.LlamaDecoderLayer] * 3


def test_scanned_llama_replays_under_txc_compile(dev):
    """txc.compile records the scanned step and replays it (the recording must
    not hold the scan's backward-body autograd graph: its leaves are body
    values, which its sync could not compute)."""
    base = llama(2, use_cache=False)
    ids = torch.randint(0, V, (2, 8))

    def trainer(model, ids):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        return step

    ref_model = copy.deepcopy(base)  # CPU eager
    ref_step = trainer(ref_model, ids)
    ref = [ref_step() for _ in range(4)]
    model = scan_decoder_layers(copy.deepcopy(base).to(dev))
    step = txc.compile(trainer(model, ids.to(dev)))
    before = counters()
    losses = [step().cpu() for _ in range(4)]
    assert delta(before, "replay") == 2 and delta(before, "replay_record") == 1
    assert delta(before, "replay_refused") == 0 and delta(before, "scan_hf_scanned") == 2  # traced calls only
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref), atol=1e-4, rtol=1e-4)
    for p, r in zip(model.parameters(), ref_model.parameters()):  # the replays trained it as eager did
        torch.testing.assert_close(p.detach().cpu(), r.detach(), atol=1e-4, rtol=1e-4)


def _step_hlo(n, scanned, dev):
    model = llama(n, use_cache=False).to(dev)
    if scanned:
        scan_decoder_layers(model)
    ids = torch.randint(0, V, (2, 8)).to(dev)
    loss = model(input_ids=ids, labels=ids).loss
    fwd = txc.debug.stablehlo([loss])
    loss.backward()
    step = txc.debug.stablehlo([loss] + [p.grad for p in model.parameters()])
    return fwd, step


def test_stablehlo_one_loop_not_n_layer_copies(dev):
    count = {}
    for n in (2, 4):
        for scanned in (False, True):
            fwd, step = _step_hlo(n, scanned, dev)
            count[n, scanned] = (fwd.count('"stablehlo.while"'), step.count('"stablehlo.while"'),
                                 step.count('"stablehlo.dot_general"'))
    # scanned: one loop forward, one more for the backward; the same graph size for 2 and 4 layers
    assert count[2, True][:2] == (1, 2) and count[4, True] == count[2, True]
    # unrolled: no loop, a copy of each layer's products per layer
    assert count[2, False][:2] == (0, 0) and count[4, False][2] > count[2, False][2]
    assert count[4, True][2] < count[4, False][2]


def test_cache_and_per_layer_outputs_run_unrolled(dev):
    base = llama(2).eval()
    ids = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        ref = base(input_ids=ids, use_cache=True, output_hidden_states=True)
    model = scan_decoder_layers(copy.deepcopy(base).to(dev))
    before = counters()
    with torch.no_grad():
        out = model(input_ids=ids.to(dev), use_cache=True)  # eval + cache: filled by the unrolled loop
        assert delta(before, "scan_hf_unrolled") == 1 and delta(before, "scan_hf_scanned") == 0
        assert out.past_key_values.get_seq_length() == 8
        torch.testing.assert_close(out.logits.cpu(), ref.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.past_key_values.layers[1].keys.cpu(), ref.past_key_values.layers[1].keys,
                                   atol=1e-5, rtol=1e-5)
        hs = model(input_ids=ids.to(dev), use_cache=False, output_hidden_states=True).hidden_states
        assert delta(before, "scan_hf_unrolled") == 2 and len(hs) == 3
        torch.testing.assert_close(hs[1].cpu(), ref.hidden_states[1], atol=1e-5, rtol=1e-5)
        out = model(input_ids=ids.to(dev), use_cache=False)  # no cache: scanned
        assert delta(before, "scan_hf_scanned") == 1
        torch.testing.assert_close(out.logits.cpu(), ref.logits, atol=1e-5, rtol=1e-5)
    before = counters()
    tokens = model.generate(ids.to(dev), max_new_tokens=3, do_sample=False)  # a KV cache filled: unrolled
    assert delta(before, "scan_hf_unrolled") == 3 and delta(before, "scan_hf_scanned") == 0
    assert tokens.cpu().tolist() == base.generate(ids, max_new_tokens=3, do_sample=False).tolist()


def test_qwen2_enumerate_loop_and_padding_mask(dev):
    """Qwen2's loop is `for i, layer in enumerate(self.layers[:n])` with the
    mask picked by config.layer_types[i] (all full attention here): scanned,
    with a padding mask (a 4-d float mask, a loop invariant)."""
    torch.manual_seed(0)
    base = T.Qwen2ForCausalLM(T.Qwen2Config(**_S, num_hidden_layers=3, num_key_value_heads=2, use_cache=False)).eval()
    ids = torch.randint(0, V, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        ref = base(input_ids=ids, attention_mask=mask).logits
    model = scan_decoder_layers(copy.deepcopy(base).to(dev))
    before = counters()
    with torch.no_grad():
        out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
    assert delta(before, "scan_hf_scanned") == 1 and delta(before, "scan_hf_unrolled") == 0
    torch.testing.assert_close(out.cpu()[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)


def test_outside_forward_the_layers_are_a_plain_modulelist():
    model = llama(3)
    layers = list(model.model.layers)
    scan_decoder_layers(model)
    assert list(model.model.layers) == layers and list(model.model.layers[1:]) == layers[1:]
    assert model.model.layers[0] is layers[0] and len(model.model.layers) == 3
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(input_ids=None)  # a forward that raises leaves the layers plain too
    assert list(model.model.layers) == layers
    scan_decoder_layers(model, enable=False)
    assert type(model.model.layers) is nn.ModuleList
    assert not model.model._forward_pre_hooks and not model.model._forward_hooks
    with warnings.catch_warnings():  # unrolled again on CPU: no use_cache rewrite
        warnings.simplefilter("error")
        model(input_ids=torch.randint(0, V, (1, 4)), labels=torch.randint(0, V, (1, 4)))


def test_refuses_layers_of_different_types():
    m = T.Gemma2ForCausalLM(T.Gemma2Config(**_S, num_hidden_layers=2, num_key_value_heads=2, head_dim=8,
                                           sliding_window=8))
    with pytest.raises(TypeError, match=r"config.layer_types differ \(layer 1 is 'full_attention'"):
        scan_decoder_layers(m)
    assert type(m.model.layers) is nn.ModuleList


def test_refuses_layers_with_different_attributes():
    m = llama(2)
    m.model.layers[1].self_attn.scaling = 0.5
    with pytest.raises(TypeError, match=r"layer 1's self_attn.scaling is 0.5"):
        scan_decoder_layers(m)


class _Collecting(nn.Module):
    """A decoder whose loop does more than h = layer(h) per layer."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, h):
        states = []
        for layer in self.layers:
            h = layer(h)
            states.append(h)
        return h, states


def test_refuses_a_loop_that_does_more_per_layer():
    with pytest.raises(TypeError, match=r"layer loop of _Collecting.forward .* does more than"):
        scan_decoder_layers(_Collecting())
    with pytest.raises(TypeError, match="found no decoder layers in GPT2LMHeadModel"):
        scan_decoder_layers(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4)))
