"""What the ``dit`` bench rows time inside the engines (through :mod:`engines.instruments`): a diffusion family's
decoder paths side by side on the same inputs, alternating round by round."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from engines.gpt_sovits.cfm import check_sampling, sample
from engines.gpt_sovits.diffusion import PATHS, DiffusionDecoder
from engines.gpt_sovits.tiny import _atomic  # pyright: ignore[reportPrivateUsage]
from engines.gpt_sovits.tiny_dit import write_dit_family
from engines.runtime import set_cpu_threads

__all__ = ["time_dit_paths"]


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@torch.inference_mode()
def time_dit_paths(family: str, size: str, frames: int, threads: int, folder: str | Path, rounds: int,
                   timed_steps: int, vocoder_s: float) -> dict[str, Any]:
    """Write ``family``'s random model files at ``size`` under ``folder``, load every decoder path and time each
    ``rounds`` times in turn: a sampler call of ``frames`` frames (the family's prompt of at most half of them) and
    ``min(timed_steps, default steps)`` steps with the family's guidance, then the vocoder on ``vocoder_s`` seconds
    of mel.

    Returns
    -------
    dict
        ``steps``/``cfg`` (the family's defaults), ``prompt_frames``, ``mel_frame_rate`` and per path ``dit_ms``
        (ms per step, every round), ``vocoder_rtf`` (every round) and ``precisions`` (what ran).
    """
    set_cpu_threads(threads)
    files = write_dit_family(Path(folder) / family, family, size, 1, _atomic)
    decoders = {p: DiffusionDecoder.load(files["sovits"], files["vocoder"], path=p, threads=threads,
                                         cache_dir=Path(folder) / "proofs") for p in PATHS}
    spec = decoders["naive"].family
    steps, cfg = check_sampling(spec, None, None)
    prompt_frames = min(spec.prompt_frames, frames // 2)
    gen = torch.Generator().manual_seed(0)
    mu = 0.5 * torch.randn(1, frames, decoders["naive"].sovits.cfg.feature_dim, generator=gen)
    prompt = 0.3 * torch.randn(1, 100, prompt_frames, generator=gen) - 0.4
    noise = torch.randn(1, 100, frames, generator=gen)
    mel = 0.3 * torch.randn(1, 100, int(vocoder_s * spec.mel_frame_rate), generator=gen) - 0.4
    call_steps = min(timed_steps, steps)
    out: dict[str, Any] = {"steps": steps, "cfg": cfg, "prompt_frames": prompt_frames,
                           "mel_frame_rate": spec.mel_frame_rate, "paths": {}}
    for p in PATHS:
        out["paths"][p] = {"dit_ms": [], "vocoder_rtf": [], "precisions": dict(decoders[p].precisions)}
    for _ in range(rounds):
        for p in PATHS:
            d, rec = decoders[p], out["paths"][p]
            rec["dit_ms"].append(1000 * _seconds(lambda: sample(d.estimator, mu, prompt, call_steps, spec, cfg, noise))
                                 / call_steps)
            d.vocode(mel[..., :8])
            rec["vocoder_rtf"].append(_seconds(lambda: d.vocode(mel)) / vocoder_s)
    return out
