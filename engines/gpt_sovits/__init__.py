"""GPT-SoVITS in torch: the checkpoints, the GPT, the SoVITS decoder and the SV model, with what they share."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Generator, TypeVar

if TYPE_CHECKING:
    from torch import nn

M = TypeVar("M", bound="nn.Module")


def dynamic_int8(module: M, keep: Callable[[str], bool] | None = None) -> M:
    """A copy of ``module`` (on the CPU) with its linear layers in torch's dynamic int8: int8 weights per output
    channel, activations rounded to uint8 per call, fbgemm's kernels (what the GPT runs without the fused step, and
    the int8 BERT); the linears whose qualified name ``keep`` accepts stay fp32."""
    import copy
    import warnings

    import torch
    from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig

    modules: list[tuple[str, torch.nn.Module]] = list(module.named_modules())  # pyright: ignore[reportUnknownArgumentType]
    swapped = [(name, m) for name, m in modules
               if isinstance(m, torch.nn.Linear) and not (keep is not None and keep(name))]
    spec: dict[str, Any] = {name: per_channel_dynamic_qconfig for name, _ in swapped}
    # The copy shares the fp32 weights of the linears it swaps instead of copying them first (quantize_dynamic's own
    # copy does): they are read once to quantise and dropped, and the process never holds two fp32 models (real-size
    # BERT: 1.1 GB of them). ``module`` itself is not changed.
    memo: dict[int, Any] = {id(p): p for _, m in swapped for p in m.parameters(recurse=False)}
    copied = copy.deepcopy(module, memo)
    with warnings.catch_warnings():  # torch marks eager quantisation deprecated in favour of torchao
        warnings.simplefilter("ignore")
        # deprecated as said above, and its signature is untyped; the copy has the module's own class
        return torch.ao.quantization.quantize_dynamic(  # pyright: ignore[reportDeprecated, reportUnknownMemberType, reportUnknownVariableType]
            copied, spec, dtype=torch.qint8, inplace=True)


@contextlib.contextmanager
def int8_packing(gemm: str) -> Generator[None]:
    """torch's quantized engine is ``gemm`` (``fbgemm`` or ``onednn``) inside: a dynamic int8 linear is packed for the
    engine current when it is made and runs that library's kernels from then on, whatever the engine is later."""
    import torch

    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = gemm
    try:
        yield
    finally:
        torch.backends.quantized.engine = engine


def ieee_fp32_on_cuda(device: Any) -> None:
    """On a CUDA ``device``: fp32 convolutions and matrix products in IEEE fp32, not TF32, and attention without
    cuDNN's kernels. Process-wide, as torch's switches are.

    cuDNN runs fp32 convolutions in TF32 by default, which put the fp32 SoVITS waveform beyond the 1e-4 conformance
    bound; fp32 on a GPU is the exact mode (the fast ones are fp16/bf16, which this does not touch).

    torch's attention picks cuDNN's on Hopper, which builds a plan for every new shape: each new sentence length and
    each new cache length stalled for a large part of a second, a stall a user hears; flash / memory-efficient
    attention does not (see FINDINGS.md#fp32-on-cuda)."""
    import torch

    if not str(device).startswith("cuda"):
        return
    torch.backends.cuda.enable_cudnn_sdp(False)
    # torch's old switches, not its per-operator precision (fp32_precision = "ieee", see FINDINGS.md#fp32-on-cuda):
    # after that one, reading torch.backends.cudnn.allow_tf32, as other code may, raises (torch 2.13); these set every
    # operator's precision to "none", which is not TF32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
