"""What the ``dit`` bench rows time inside the engines (through :mod:`engines.instruments`): a diffusion family's
decoder paths side by side on the same inputs, alternating round by round; and upstream's whole pipeline
(:class:`NaiveDitPipeline`), the baseline of the product's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from engines.base import SemanticRequest, VoicePrompt
from engines.gpt_sovits.cfm import check_sampling, sample
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.diffusion import PATHS, DiffusionDecoder, DiffusionPrompt
from engines.gpt_sovits.generate import request_inputs
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.naive import naive_generate
from engines.gpt_sovits.tiny import _atomic  # pyright: ignore[reportPrivateUsage]
from engines.gpt_sovits.tiny_dit import write_dit_family
from engines.plan import Settings, plan_engine, probe_machine
from engines.runtime import set_cpu_threads

__all__ = ["NaiveDitPipeline", "time_dit_paths"]


def _seconds(fn: Callable[[], Any], device: str = "cpu") -> float:
    t0 = time.perf_counter()
    fn()
    if device != "cpu":
        torch.cuda.synchronize(device)  # a GPU's work is queued: its end is when the device says so
    return time.perf_counter() - t0


REFERENCE_SIZE = 1024  # the reference product's side: far past every cache, so it runs at the cores' own speed
REFERENCE_PRODUCTS = 20  # about 0.2 s on 2 cores


def reference_gflops(device: str = "cpu") -> float:
    """How fast this machine runs a fixed fp32 product right now, GFLOP/s: a shared VM's speed moves between states
    within seconds (by 1.5x on one measured in benchmarks/FINDINGS.md), and a timing means little without it."""
    a = torch.ones(REFERENCE_SIZE, REFERENCE_SIZE, device=device)
    _seconds(lambda: a @ a, device)  # (the first product on a GPU pays its kernel's load)
    seconds = _seconds(lambda: [a @ a for _ in range(REFERENCE_PRODUCTS)], device)
    return 2 * REFERENCE_SIZE**3 * REFERENCE_PRODUCTS / seconds / 1e9


def _decoder(files: dict[str, Path], path: str, device: str, threads: int, folder: str | Path,
             int8_gemm: str, attention: str) -> DiffusionDecoder:
    """One decoder path as the bench times it. On a CUDA device: ``naive`` upstream's eager fp32, ``fp32`` the fast
    path's DiT in fp32 stepped eagerly, ``fast`` what the product runs there (fp16, the steps from CUDA graphs)."""
    if device == "cpu":
        return DiffusionDecoder.load(files["sovits"], files["vocoder"], path=path, threads=threads,
                                     cache_dir=Path(folder) / "proofs", int8_gemm=int8_gemm, attention=attention)
    dtype = torch.float16 if path == "fast" else torch.float32
    return DiffusionDecoder.load(files["sovits"], files["vocoder"], device=device, dtype=dtype, path=path,
                                 cuda_graphs=path == "fast")


@torch.inference_mode()
def time_dit_paths(family: str, size: str, frames: int, threads: int, folder: str | Path, rounds: int,
                   timed_steps: int, vocoder_s: float, device: str = "cpu") -> dict[str, Any]:
    """Write ``family``'s random model files at ``size`` under ``folder``, load every decoder path and time each
    ``rounds`` times in turn: a sampler call of ``frames`` frames (the family's prompt of at most half of them) and
    ``min(timed_steps, default steps)`` steps with the family's guidance, then the vocoder on ``vocoder_s`` seconds
    of mel. ``device``: ``cpu`` or a CUDA device (the paths there: :func:`_decoder`).

    Returns
    -------
    dict
        ``steps``/``cfg`` (the family's defaults), ``prompt_frames``, ``mel_frame_rate``, ``int8_gemm`` and
        ``attention`` (the fast path's, as the engine plan picks them here) and per path ``dit_ms`` (ms per step,
        every round), ``ref_gflops`` (:func:`reference_gflops` just before each of those rounds), ``vocoder_rtf``
        (every round) and ``precisions`` (what ran).
    """
    set_cpu_threads(threads)
    files = write_dit_family(Path(folder) / family, family, size, 1, _atomic)
    plan = plan_engine(Settings(device=device, threads=threads), probe_machine(), diffusion=True)  # what auto runs
    decoders = {p: _decoder(files, p, device, threads, folder, plan.int8_gemm or "fbgemm", plan.dit_attention)
                for p in PATHS}
    spec = decoders["naive"].family
    steps, cfg = check_sampling(spec, None, None)
    prompt_frames = min(spec.prompt_frames, frames // 2)
    gen = torch.Generator().manual_seed(0)
    mu = 0.5 * torch.randn(1, frames, decoders["naive"].sovits.cfg.feature_dim, generator=gen)
    prompt = 0.3 * torch.randn(1, 100, prompt_frames, generator=gen) - 0.4
    noise = torch.randn(1, 100, frames, generator=gen)
    mel = 0.3 * torch.randn(1, 100, int(vocoder_s * spec.mel_frame_rate), generator=gen) - 0.4
    inputs = {p: [t.to(device, d.sovits.codebook.dtype) for t in (mu, prompt, noise, mel)]
              for p, d in decoders.items()}  # (each path's own dtype on its device)
    call_steps = min(timed_steps, steps)
    out: dict[str, Any] = {"steps": steps, "cfg": cfg, "prompt_frames": prompt_frames,
                           "mel_frame_rate": spec.mel_frame_rate, "int8_gemm": plan.int8_gemm,
                           "attention": plan.dit_attention, "paths": {}}
    for p in PATHS:
        out["paths"][p] = {"dit_ms": [], "ref_gflops": [], "vocoder_rtf": [],
                           "precisions": dict(decoders[p].precisions)}
    for _ in range(rounds):
        for p in PATHS:
            d, rec = decoders[p], out["paths"][p]
            mu_p, prompt_p, noise_p, mel_p = inputs[p]
            rec["ref_gflops"].append(reference_gflops(device))
            rec["dit_ms"].append(1000 * _seconds(lambda: sample(d.estimator, mu_p, prompt_p, call_steps, spec, cfg,
                                                               noise_p), device) / call_steps)
            d.vocode(mel_p[..., :8])
            rec["vocoder_rtf"].append(_seconds(lambda: d.vocode(mel_p), device) / vocoder_s)
    return out


class NaiveDitPipeline:
    """A diffusion family's model set the way upstream GPT-SoVITS runs it, on the CPU: each sentence's tokens from
    upstream's GPT loop (:func:`~engines.gpt_sovits.naive.naive_generate`, fp32), then the whole sentence through
    the ``naive`` decoder path (the eager fp32 DiT every step at the family's default steps, one eager torch vocoder
    call over the sentence's mel). A sentence comes back when all of it is made, as upstream returns it.

    Parameters
    ----------
    gpt:
        the fp32 GPT whose weights the loop reads.
    decoder:
        the family's SoVITS and vocoder on the ``naive`` path.
    """

    def __init__(self, gpt: Text2SemanticModel, decoder: DiffusionDecoder) -> None:
        self.gpt = gpt
        self.decoder = decoder
        self.steps, self.cfg = check_sampling(decoder.family, None, None)
        self._voice: VoicePrompt | None = None
        self._prompt: DiffusionPrompt | None = None

    @classmethod
    def load(cls, gpt: str | Path, sovits: str | Path, vocoder: str | Path, threads: int = 0) -> NaiveDitPipeline:
        """Load the GPT (fp32), the SoVITS and the vocoder files of one model set; torch gets ``threads`` threads
        in the calling thread (0: every core)."""
        set_cpu_threads(threads)
        model = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(gpt), "cpu", torch.float32)
        return cls(model, DiffusionDecoder.load(sovits, vocoder, path="naive", threads=threads))

    @property
    def sample_rate(self) -> int:
        """Output rate in Hz."""
        return self.decoder.sample_rate

    @torch.inference_mode()
    def speak(self, request: SemanticRequest, speed: float = 1.0, seed: int = 0) -> np.ndarray:
        """One sentence: ``[N]`` float32 at :attr:`sample_rate`.

        ``request`` is what the product's GPT gets (target phones, BERT features, the voice, sampling with its
        ``early_stop_num``); the voice's prompt is computed from its stored arrays as the engine computes it, once
        per voice (upstream keeps it from ``set_ref_audio`` on too). ``seed`` draws the sampler's start noise.
        """
        if request.voice is not self._voice:
            v = request.voice
            if v.ref_mel is None:
                raise ValueError("the voice has no reference mel; encode it with the diffusion family's engine")
            self._prompt = self.decoder.stored_prompt(v.ge, v.prompt_tokens, v.prompt_phones, v.ref_mel)
            self._voice = v
        assert self._prompt is not None  # set with _voice
        phones, bert, prompt = request_inputs(request)
        tokens = naive_generate(self.gpt, phones, bert, prompt, request.params)
        codes = torch.as_tensor(tokens, dtype=torch.int64).view(1, 1, -1)
        text = torch.as_tensor(np.asarray(request.phones, np.int64)).view(1, -1)
        wav = self.decoder.decode(codes, text, self._prompt, self.steps, self.cfg, speed,
                                  generator=torch.Generator().manual_seed(seed))
        return wav.numpy().astype(np.float32, copy=False)
