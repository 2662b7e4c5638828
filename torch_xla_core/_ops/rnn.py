"""The fused RNN cells that torch's LSTM/GRU (and LSTMCell/GRUCell) use on
accelerator devices, xla included: `_thnn_fused_lstm_cell`,
`_thnn_fused_gru_cell` and their backward ops, written in terms of the
elementwise core ops (the gate matmuls stay outside, as torch issues them).
The workspace layouts are ours (each backward reads what its forward saved):
LSTM [i, f, g, o] (activated gates, [B, 4H]); GRU [r, z, n, hx, hn] ([B, 5H],
hn including the hidden bias). Same math as torch's CUDA kernels.
Also _pack_padded_sequence (packed inputs to LSTM/GRU), whose batch_sizes
stay on the host."""
import torch

from . import aten, impl


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    g = input_gates + hidden_gates
    if input_bias is not None:
        g = g + input_bias
    if hidden_bias is not None:
        g = g + hidden_bias
    return g


@impl(aten._thnn_fused_lstm_cell.default)
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


@impl(aten._thnn_fused_lstm_cell_backward_impl.default)
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = workspace.chunk(4, 1)
    tcy = cy.tanh()
    d_cy = torch.zeros_like(cy) if grad_cy is None else grad_cy
    d_o = torch.zeros_like(cy)
    if grad_hy is not None:
        d_cy = d_cy + grad_hy * o * (1 - tcy * tcy)
        d_o = grad_hy * tcy * o * (1 - o)
    d_i = d_cy * g * i * (1 - i)
    d_f = d_cy * cx * f * (1 - f)
    d_g = d_cy * i * (1 - g * g)
    grad_gates = torch.cat([d_i, d_f, d_g, d_o], 1)
    return grad_gates, d_cy * f, grad_gates.sum(0) if has_bias else None


@impl(aten._thnn_fused_gru_cell.default)
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


@impl(aten._thnn_fused_gru_cell_backward.default)
def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    d_hx = grad_hy * z
    d_in = grad_hy * (1 - z) * (1 - n * n)
    d_hn = d_in * r
    d_r = d_in * hn * r * (1 - r)
    grad_input = torch.cat([d_r, d_z, d_in], 1)
    grad_hidden = torch.cat([d_r, d_z, d_hn], 1)
    if has_bias:
        return grad_input, grad_hidden, d_hx, grad_input.sum(0), grad_hidden.sum(0)
    return grad_input, grad_hidden, d_hx, None, None


@impl(aten._pack_padded_sequence.default)
def pack_padded_sequence(x, lengths, batch_first):
    """nn.utils.rnn.pack_padded_sequence: `lengths` live on the host (torch
    requires it), so batch_sizes are computed there and stay a CPU tensor,
    as PackedSequence requires; the data are the time steps' live rows,
    concatenated (static shapes: slices and one cat on the device)."""
    if lengths.device.type != "cpu" or lengths.dim() != 1:
        raise RuntimeError(f"_pack_padded_sequence: 'lengths' must be a 1-D CPU int64 tensor, got "
                           f"{lengths.dim()}-D on {lengths.device}")
    if batch_first:
        x = x.transpose(0, 1)
    ls = [int(v) for v in lengths.tolist()]
    if not ls or x.shape[1] != len(ls):
        raise RuntimeError(f"_pack_padded_sequence: expected {x.shape[1]} lengths (the batch size), got {len(ls)}")
    if min(ls) <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    if any(a < b for a, b in zip(ls, ls[1:])):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                           "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to "
                           "sidestep this requirement if you do not need ONNX exportability.")
    if ls[0] > x.shape[0]:
        raise RuntimeError(f"_pack_padded_sequence: a length {ls[0]} exceeds the sequence length {x.shape[0]}")
    batch_sizes = [sum(1 for n in ls if n > t) for t in range(ls[0])]
    steps, t = [], 0
    while t < ls[0]:  # runs of time steps with the same batch size: one slice each
        b, end = batch_sizes[t], t
        while end < ls[0] and batch_sizes[end] == b:
            end += 1
        steps.append(x[t:end, :b].reshape(-1, *x.shape[2:]))
        t = end
    return torch.cat(steps), torch.tensor(batch_sizes, dtype=torch.int64)
