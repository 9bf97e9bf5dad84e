"""What a benchmark measures from the inside of the engines: the one surface the ``benchmarks`` package uses below
``engines.__all__``.

The product never needs these: the naive upstream-style loop (the baseline every figure is compared with) and a
diffusion family's whole naive pipeline, each backend class built at the batch size being measured, the GPT's sizes
and KV buckets, the device and precision ``auto`` resolves to, the CPU thread count, the exported graphs, and the
torch-side measurements (runtime versions and kernels, memory bandwidth, peak memory, a checkpoint edited so that
random weights decode a fixed number of steps, teacher-forced logits). Every name loads on first use, so that a
benchmark process imports only the backend it measures (its peak memory is that backend's own).
"""

from __future__ import annotations

import importlib
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

BANDWIDTH_MB = 512  # size of the array read to measure memory bandwidth (far beyond any L3)

_NAMES = {  # name -> the module that defines it, imported on first use
    "naive_generate": "engines.gpt_sovits.naive",
    "request_inputs": "engines.gpt_sovits.generate",
    "KV_BUCKET": "engines.gpt_sovits.gpt", "GptConfig": "engines.gpt_sovits.gpt",
    "load_gpt_checkpoint": "engines.gpt_sovits.checkpoint", "load_sovits_checkpoint": "engines.gpt_sovits.checkpoint",
    "TorchEngine": "engines.torch_engine", "OnnxEngine": "engines.onnx_engine",
    "ensure_onnx": "engines.export", "quantize_step_int8": "engines.export",
    "quantize_vocoder_int8": "engines.vocoder_int8", "choose_vocoder": "engines.vocoder_int8",
    "choose_backend": "engines.loader", "resolve_precision": "engines.loader", "resolve_device": "engines.loader",
    "cpu_threads": "engines.runtime", "set_cpu_threads": "engines.runtime",
    "time_dit_paths": "engines.gpt_sovits.dit_timing", "NaiveDitPipeline": "engines.gpt_sovits.dit_timing",
}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def runtime_info() -> dict[str, Any]:
    """The runtimes the figures come from: torch's version, the ATen kernels it dispatches to and its quantized
    engine; ONNX Runtime's version and providers (None when not installed); how the fused CPU step was built, or
    why it is unavailable."""
    import torch

    from engines.gpt_sovits import cpu_step

    info: dict[str, Any] = {
        "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_quantized_engine": torch.backends.quantized.engine,
    }
    try:
        import onnxruntime as ort

        info["onnxruntime"] = ort.__version__
        info["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError:
        info["onnxruntime"] = None
    if cpu_step.load_library() is not None:
        cc = cpu_step.find_compiler() or "cc"
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        info["fused_step"] = f"built with {' '.join(version) or cc} ({' '.join(cpu_step.CFLAGS[:2])})"
    else:
        info["fused_step"] = f"unavailable: {cpu_step.unavailable_reason()}"
    return info


# How the libraries learn each ISA flag: torch's cpuinfo reads CPUID, as ONNX Runtime, oneDNN and fbgemm do.
_SEEN_BY_LIBRARIES = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
                      "avx512_vnni": "_is_vnni_supported", "avx512_bf16": "_is_avx512_bf16_supported",
                      "amx_tile": "_is_amx_tile_supported"}


def isa_seen() -> dict[str, bool]:
    """The ISA flags as the libraries see them (CPUID), for those torch can tell; where CPUID is masked (``make
    bench-avx2``) they differ from /proc/cpuinfo, and the kernels that run are the narrower ISA's."""
    import torch

    seen: dict[str, bool] = {}
    for flag, probe in _SEEN_BY_LIBRARIES.items():
        fn = getattr(torch.cpu, probe, None)
        if fn is not None:
            seen[flag] = bool(fn())
    return seen


def read_bandwidth_gb_s(threads: int) -> float:
    """Memory read bandwidth in GB/s: a large fp32 array summed with ``threads`` threads (0: every core), best of 5.

    The batch-1 GPT step reads every weight once, so this over the weights' bytes is the floor of its time."""
    import torch

    from engines.runtime import cpu_threads

    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(threads))
    try:
        a = torch.ones(BANDWIDTH_MB * 2**20 // 4)  # written once: the pages exist before the reads are timed
        best = float("inf")
        for _ in range(6):
            t0 = time.perf_counter()
            float(a.sum())
            best = min(best, time.perf_counter() - t0)
        return a.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(before)


def peak_mem_mb(device: str) -> float:
    """This process's peak memory in MiB: the CUDA allocator's on a GPU, else the resident high-water mark."""
    import resource

    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    # VmHWM belongs to this process's own address space (ru_maxrss would carry the parent's over exec)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def zero_eos_in_file(gpt_path: Path) -> None:
    """Random weights: make EOS never win (its output row zeroed in the checkpoint), so every backend decodes
    exactly ``early_stop_num`` steps."""
    import torch

    ckpt = torch.load(gpt_path, map_location="cpu", weights_only=True)
    ckpt["weight"]["model.ar_predict_layer.weight"][1024].zero_()
    torch.save(ckpt, gpt_path)


def forced_logits(gpt: Any, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray, steps: int,
                  fed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A GPT (the BatchDecoder surface: setup_caches, prefill, decode_step) run for ``steps`` steps, fed back
    ``fed`` (teacher-forced) or, when None, its own raw argmax (greedy); returns (logits ``[steps, V]``, fed)."""
    import torch

    from engines.gpt_sovits.gpt import KV_BUCKET

    s = len(phones) + len(prompt)
    own = fed is None
    fed_list: list[int] = [] if fed is None else [int(t) for t in fed]
    with torch.inference_mode():
        gpt.setup_caches(1, -(-(s + steps + 1) // KV_BUCKET) * KV_BUCKET)
        out = [gpt.prefill(0, torch.as_tensor(phones), torch.as_tensor(bert), torch.as_tensor(prompt)).float()]
        for i in range(steps - 1):
            if own:
                fed_list.append(int(out[-1].argmax()))
            kv_len = -(-(s + i + 1) // KV_BUCKET) * KV_BUCKET
            out.append(gpt.decode_step(torch.tensor([fed_list[i]]), torch.tensor([s + i]), None, kv_len)[0].float())
        return torch.stack(out).numpy(), np.asarray(fed_list, np.int64)

