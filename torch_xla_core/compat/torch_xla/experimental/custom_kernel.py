"""torch_xla.experimental.custom_kernel: repeat_with_fixed_output_size (a
repeat_interleave whose output length is fixed, so it compiles without a
data-dependent shape). torch_xla's Pallas kernels of this module
(flash_attention, paged_attention, ...) are txc.kernels here, under their
own signatures (docs/porting.md)."""
import torch


def repeat_with_fixed_output_size(input: torch.Tensor, repeats: torch.Tensor, total_repeat_length: int):
    """torch.repeat_interleave(input, repeats) (1-D input, one repeat count
    per element) cut or extended to total_repeat_length elements: longer
    results are truncated, shorter ones filled with input's last element.
    No host read: each output position finds its element by counting the
    cumulative repeats at or below it."""
    if input.dim() != 1 or repeats.dim() != 1 or input.shape[0] != repeats.shape[0]:
        raise ValueError(f"repeat_with_fixed_output_size: expected a 1-D input and one repeat count per element, "
                         f"got input {list(input.shape)} and repeats {list(repeats.shape)}")
    if input.shape[0] == 0:
        raise ValueError("repeat_with_fixed_output_size: input is empty: there is no element to repeat or fill with")
    ends = torch.cumsum(repeats, 0)
    pos = torch.arange(total_repeat_length, device=input.device, dtype=ends.dtype)
    index = (ends.unsqueeze(0) <= pos.unsqueeze(1)).sum(1).clamp(max=input.shape[0] - 1)
    return input[index]
