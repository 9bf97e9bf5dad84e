"""Flow-matching sampling of the diffusion families: one sampler call, and the chunk loops around it (reference
sections 4 and 6).

One call (:func:`sample`) integrates ``dx/dt = v(x, t)`` by Euler from noise at ``t = 0`` in ``n`` steps
(``t_k = k/n``, ``x += v/n``) with the prompt frames of ``x`` held at zero; v5 adds classifier-free guidance whose
negative drops only the audio prompt (``v + cfg (v - v_neg)``). A sentence is sampled in chunks of at most
``chunk_frames`` (prompt + target) frames:

* v3/v4 (upstream ``using_vocoder_synthesis``): the reference is cut to ``T_min`` frames (at most ``T_ref``), and
  after each chunk the *whole* prompt becomes the end of what was just made;
* v5 (``synthesize_v5_mel``): the reference (at most 500 frames) stays the prompt; from the second chunk on only
  its last 32 frames are replaced by the end of the previous chunk, and targets are at most 640 frames a chunk.

:func:`iter_mel_chunks` yields each chunk's mel as soon as it is sampled, for streaming; :func:`synthesize_mel`
concatenates them, as upstream does before its one vocoder call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import torch
from torch import Tensor

from engines.gpt_sovits.family import FamilySpec

__all__ = ["Estimator", "MelPrompt", "sample", "iter_mel_chunks", "synthesize_mel", "check_sampling", "NoiseSource"]

MEL_DIM = 100
CFG_EPS = 1e-5  # a guidance rate at or below this is off (upstream)
MAX_CFG = 2.0  # v5 validates cfg in [0, 2]

NoiseSource = Callable[[int, int], Tensor]
"""``(chunk index, frames) -> [1, 100, frames]`` standard-normal noise for that chunk's sampler call."""


class Estimator(Protocol):
    """The velocity network as the sampler drives it: :class:`~engines.gpt_sovits.dit.DiT` (the fast path, fp32),
    its int8 copy, or :class:`~engines.gpt_sovits.dit_naive.NaiveDiT` (upstream's eager forward per step)."""

    def prepare(self, cond: Tensor, text: Tensor, times: Tensor, d: Tensor | None, x_lens: Tensor | None = None,
                negative: str | None = None) -> Any:
        """What stays fixed over one sampler call (see :meth:`engines.gpt_sovits.dit.DiT.prepare`)."""
        ...

    def step(self, x: Tensor, prep: Any, k: int) -> Tensor:
        """The velocity ``[B, T, 100]`` at step ``k`` (row 1: the CFG negative, when prepared)."""
        ...


@dataclass(frozen=True)
class MelPrompt:
    """The reference a sentence is sampled after, aligned as the family wants it (:meth:`from_reference`).

    Attributes
    ----------
    features:
        ``[1, C, R]`` the reference's encoder features (``decode_encp`` of its tokens and phones).
    mel:
        ``[1, 100, R]`` the reference's normalised log-mel, the same ``R`` frames.
    """

    features: Tensor
    mel: Tensor

    @property
    def frames(self) -> int:
        """``R``, the prompt length in frames."""
        return int(self.mel.shape[-1])

    @classmethod
    def from_reference(cls, features: Tensor, mel: Tensor, spec: FamilySpec) -> MelPrompt:
        """The first ``min(frames)`` of both, then at most the family's last ``prompt_frames``.

        Raises
        ------
        ValueError
            either is empty (a reference shorter than one frame).
        """
        frames = min(int(mel.shape[-1]), int(features.shape[-1]))
        if frames < 1:
            raise ValueError("the reference gave no mel or feature frames; record a longer reference clip")
        keep = min(frames, spec.prompt_frames)
        return cls(features=features[..., :frames][..., frames - keep:], mel=mel[..., :frames][..., frames - keep:])


def check_sampling(spec: FamilySpec, steps: int | None, cfg: float | None) -> tuple[int, float]:
    """``(steps, cfg)`` with the family's defaults filled in; ValueError (one line, with the allowed values) if
    they are out of range. v3/v4 ignore ``cfg`` (upstream never guides them)."""
    n = spec.default_steps if steps is None else int(steps)
    rate = spec.default_cfg if cfg is None else float(cfg)
    if spec.allowed_steps and n not in spec.allowed_steps:
        raise ValueError(f"{spec.name} samples in {', '.join(map(str, spec.allowed_steps))} steps, not {n}")
    if n < 1:
        raise ValueError(f"sampling steps must be at least 1, got {n}")
    if not spec.is_v5:
        return n, 0.0
    if not (0.0 <= rate <= MAX_CFG):  # also refuses NaN
        raise ValueError(f"{spec.name} guidance (cfg) must be between 0 and {MAX_CFG:g}, got {rate}")
    return n, rate


def sample(dit: Estimator, mu: Tensor, prompt: Tensor, steps: int, spec: FamilySpec, cfg: float = 0.0,
           noise: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
    """One sampler call (upstream ``CFM.inference`` / ``CFMV5.inference``).

    Parameters
    ----------
    mu:
        ``[1, T, C]`` features, time-major (prompt's, then the target's).
    prompt:
        ``[1, 100, Tp]`` normalised prompt mel, ``Tp <= T``.
    steps, cfg:
        Euler steps and (v5) guidance rate, as :func:`check_sampling` returns them.
    noise:
        ``[1, 100, T]`` standard-normal start (before the family's noise scale), else drawn with ``generator``.

    Returns
    -------
    Tensor
        ``[1, 100, T]`` the sampled normalised mel; the first ``Tp`` frames are zero.
    """
    frames, tp = int(mu.shape[1]), int(prompt.shape[-1])
    if noise is None:
        noise = torch.randn((1, MEL_DIM, frames), generator=generator, device=mu.device, dtype=mu.dtype)
    x = (noise.to(mu.dtype) * spec.noise_scale).transpose(1, 2).contiguous()  # [1, T, 100] time-major
    x[:, :tp] = 0
    cond = torch.zeros_like(x)
    cond[:, :tp] = prompt.transpose(1, 2).to(x.dtype)
    step = 1.0 / steps
    if spec.is_v5:
        times = torch.arange(steps, device=x.device, dtype=torch.float64) * step
        d = None
    else:  # upstream accumulates t in Python floats; the same sums here
        acc, ts = 0.0, list[float]()
        for _ in range(steps):
            ts.append(acc)
            acc += step
        times = torch.tensor(ts, dtype=torch.float64, device=x.device)
        d = torch.full((steps,), step, dtype=x.dtype, device=x.device)
    guided = cfg > CFG_EPS
    prep = dit.prepare(cond, mu, times.to(x.dtype), d, negative=("audio" if spec.is_v5 else "audio+text") if guided else None)
    for k in range(steps):
        v = dit.step(x, prep, k)
        if guided:
            v = v[:1] + cfg * (v[:1] - v[1:])
        x.add_(v, alpha=step)
        x[:, :tp] = 0
    return x.transpose(1, 2)


def iter_mel_chunks(dit: Estimator, prompt: MelPrompt, features: Tensor, spec: FamilySpec, steps: int, cfg: float = 0.0,
                    noise: NoiseSource | None = None, generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """Sample a sentence's normalised mel chunk by chunk, the family's way; yields ``[1, 100, n_k]`` per chunk.

    Parameters
    ----------
    prompt:
        the reference, aligned (:meth:`MelPrompt.from_reference`).
    features:
        ``[1, C, T]`` the sentence's features (:meth:`MelSoVITS.features` with the reference's ``ge``).
    steps, cfg:
        from :func:`check_sampling`.
    noise:
        per-chunk standard-normal noise (conformance tests inject upstream's), else drawn with ``generator``.
    """
    total = int(features.shape[-1])
    if total < 1:
        raise ValueError("the sentence has no feature frames to sample")
    r = prompt.frames
    if spec.is_v5:
        chunk = min(spec.chunk_frames - r, spec.max_target_frames)
    else:
        chunk = spec.chunk_frames - r
    if chunk < 1:
        raise ValueError(f"a {r}-frame prompt leaves no room in a {spec.chunk_frames}-frame chunk")
    prompt_mel, prompt_fea = prompt.mel, prompt.features
    prev_mel, prev_fea = prompt.mel, prompt.features
    for k, start in enumerate(range(0, total, chunk)):
        target = features[..., start : start + chunk]
        if spec.is_v5 and k > 0:
            tail = min(spec.rolling_tail, r, int(prev_mel.shape[-1]), int(prev_fea.shape[-1]))
            prompt_mel = torch.cat((prompt.mel[..., : r - tail], prev_mel[..., -tail:]), dim=-1)
            prompt_fea = torch.cat((prompt.features[..., : r - tail], prev_fea[..., -tail:]), dim=-1)
        mu = torch.cat((prompt_fea, target), dim=-1).transpose(1, 2)
        eps = noise(k, int(mu.shape[1])) if noise is not None else None
        out = sample(dit, mu, prompt_mel, steps, spec, cfg, eps, generator)[..., prompt_mel.shape[-1] :]
        yield out
        prev_mel, prev_fea = out[..., -r:], target[..., -r:]
        if not spec.is_v5:  # v3/v4: the next prompt is the end of this chunk
            prompt_mel, prompt_fea = prev_mel, prev_fea


def synthesize_mel(dit: Estimator, prompt: MelPrompt, features: Tensor, spec: FamilySpec, steps: int, cfg: float = 0.0,
                   noise: NoiseSource | None = None, generator: torch.Generator | None = None) -> Tensor:
    """The whole sentence's normalised mel ``[1, 100, T]`` (:func:`iter_mel_chunks`, concatenated)."""
    return torch.cat(list(iter_mel_chunks(dit, prompt, features, spec, steps, cfg, noise, generator)), dim=-1)
