"""The whole decode of a diffusion family: semantic tokens + phones + a reference -> waveform (reference section 0).

:class:`DiffusionDecoder` owns the family's SoVITS (:class:`MelSoVITS`) and vocoder and runs, for a sentence::

    features = sovits.features(tokens, phones, ge)             # [1, C, ~4N] at the mel frame rate
    mel = cfm.synthesize_mel(dit, prompt, features, steps, cfg)  # normalised, chunked as the family does
    wav = vocoder(denorm_spec(mel))                             # 48 kHz (v4/v5) or 24 kHz (v3)

A voice's part is computed once (:meth:`DiffusionDecoder.prompt`): the style ``ge`` from the 32 kHz linear
spectrogram (v2's, loudness-normalised), the reference's features from its tokens and phones, and its mel prompt
from the raw clip resampled to the family's mel rate (not normalised: upstream's quirk 7).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from engines.gpt_sovits.cfm import Estimator, MelPrompt, NoiseSource, check_sampling, iter_mel_chunks, synthesize_mel
from engines.gpt_sovits.dit_checkpoint import (BIGVGAN_WEIGHTS, is_lora_file, load_dit_sovits_checkpoint,
                                               load_vocoder48k_checkpoint)
from engines.gpt_sovits.dit_int8 import choose_estimator
from engines.gpt_sovits.dit_naive import NaiveDiT
from engines.gpt_sovits.family import FamilySpec
from engines.gpt_sovits.mel import denorm_spec, log_mel, norm_spec, resample
from engines.gpt_sovits.mel_sovits import MelSoVITS
from engines.gpt_sovits.spectrogram import reference_spec_input
from engines.gpt_sovits.vocoder48k import Vocoder48k

log = logging.getLogger(__name__)

__all__ = ["DiffusionDecoder", "DiffusionPrompt"]

STYLE_RATE = 32000  # Hz: the linear spectrogram ge is computed from (v2's front-end)
# Mel frames of context the vocoder gets on each side of a streamed piece, so a piece's samples equal those of one
# call over the whole mel (the vocoders see about +-20 frames; both tiny and released widths have these kernels)
STREAM_CONTEXT = 32
PATHS = ("fast", "fp32", "naive")  # DiffusionDecoder.load's path option


def _has_onnxruntime() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


@dataclass(frozen=True)
class DiffusionPrompt:
    """A voice as the diffusion families need it.

    Attributes
    ----------
    ge:
        ``[1, gin, 1]`` style vector.
    prompt:
        the aligned reference features and normalised mel (:class:`engines.gpt_sovits.cfm.MelPrompt`).
    """

    ge: Tensor
    prompt: MelPrompt


class DiffusionDecoder:
    """A v3/v4/v5dev/v5turbo SoVITS with its vocoder. Call its methods under ``torch.inference_mode()``.

    Parameters
    ----------
    sovits:
        the family's SoVITS.
    vocoder:
        ``log-mel [1, 100, T] -> wav [1, 1, hop T]`` (:class:`Vocoder48k`; v3: :class:`BigVGAN`).
    """

    def __init__(self, sovits: MelSoVITS, vocoder: nn.Module | Callable[[Tensor], Tensor],
                 estimator: Estimator | None = None, path: str = "fp32") -> None:
        self.sovits = sovits
        self.vocoder = vocoder
        self.estimator: Estimator = sovits.dit if estimator is None else estimator  # what the sampler runs
        self.path = path  # "fast" (and what it resolved to: see :attr:`precisions`), "fp32" or "naive"
        self.precisions = {"dit": "fp32", "vocoder": "fp32"}  # what runs (fast: int8 where proven)

    @property
    def family(self) -> FamilySpec:
        return self.sovits.family

    @property
    def sample_rate(self) -> int:
        """Output rate in Hz (48000, v3: 24000)."""
        return self.family.vocoder_rate

    @classmethod
    def load(cls, sovits_path: str | os.PathLike[str], vocoder_path: str | os.PathLike[str],
             family: str | None = None, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32, *, path: str = "fast", threads: int = 0,
             cache_dir: str | os.PathLike[str] | None = None,
             sovits_base: str | os.PathLike[str] | None = None, int8_gemm: str = "fbgemm",
             attention: str = "fp32", cuda_graphs: bool = False) -> DiffusionDecoder:
        """Load both files (restricted unpickling); ModelFormatError (one line) if either is wrong.

        ``family`` is the configured one; the SoVITS file's own header, name or config decides where it says.

        Parameters
        ----------
        path:
            ``"fast"`` (default): the DiT with everything constant over a sampler call computed once, q/k/v fused
            and CFG's negative batched with the positive; on a CPU in fp32 its block linears in int8 and the 48 kHz
            vocoder under ONNX Runtime (its residual blocks in int8), each only where its proof on this model holds
            (else fp32, logged). ``"fp32"``: the same without int8 (the exact path the conformance tests hold to
            upstream). ``"naive"``: upstream's eager fp32 forward every step and the vocoder in eager torch (the
            benchmark's baseline).
        threads:
            CPU threads of the ONNX Runtime vocoder (0: every core the process may use); torch's own follow the
            calling thread (the engine's ``bind_thread``).
        cache_dir:
            where the int8 proofs' verdicts and the int8 vocoder graph are kept (a restart does not prove again);
            None: the DiT is proven at every load and the vocoder stays fp32.
        int8_gemm, attention:
            the fast path's int8 GEMM library and attention dtype (the engine plan's ``int8_gemm`` and
            ``dit_attention``), inside the DiT's proof.
        cuda_graphs:
            on a CUDA device, the fast path replays the DiT's steps from CUDA graphs
            (:class:`~engines.gpt_sovits.dit_graphs.CudaGraphDit`).
        """
        if path not in PATHS:
            raise ValueError(f"unknown decoder path {path!r}; use one of {', '.join(PATHS)}")
        sovits = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(sovits_path, family, sovits_base), device, dtype)
        if sovits.family.name == "v3":
            from engines.gpt_sovits.bigvgan import BigVGAN  # v3 only

            vocoder: nn.Module = BigVGAN.from_folder(Path(vocoder_path), device, dtype)
        else:
            vocoder = Vocoder48k.from_state_dict(load_vocoder48k_checkpoint(vocoder_path), device, dtype)
        if path == "naive":
            return cls(sovits, vocoder, NaiveDiT(sovits.dit), path)
        decoder = cls(sovits, vocoder, sovits.dit, path)
        on_cpu = torch.device(device).type == "cpu" and dtype == torch.float32
        if not on_cpu:
            if path == "fast" and cuda_graphs and torch.device(device).type == "cuda":
                from engines.gpt_sovits.dit_graphs import CudaGraphDit

                decoder.estimator = CudaGraphDit(sovits.dit)
            return decoder
        if path == "fast":
            read = [sovits_path, *([sovits_base] if sovits_base is not None and is_lora_file(sovits_path) else [])]
            decoder.estimator, decoder.precisions["dit"] = choose_estimator(sovits, read, cache_dir, gemm=int8_gemm,
                                                                            attention=attention)
        if _has_onnxruntime():  # (both vocoders: the 48 kHz HiFi-GAN and v3's BigVGAN)
            from engines.gpt_sovits.vocoder_ort import OrtVocoder

            spec = sovits.family
            # v3's BigVGAN stays fp32: its int8 blocks missed the proof at the released size, after minutes of work
            int8 = path == "fast" and isinstance(vocoder, Vocoder48k)
            weights = Path(vocoder_path) / BIGVGAN_WEIGHTS if Path(vocoder_path).is_dir() else vocoder_path  # v3: a folder
            ort_vocoder = OrtVocoder.from_module(vocoder, threads, int8=int8, cache_dir=cache_dir, source=weights,
                                                 mel_front_end=(spec.mel_rate, spec.mel_fft, spec.mel_hop))
            decoder.vocoder, decoder.precisions["vocoder"] = ort_vocoder, ort_vocoder.precision
        return decoder

    def prompt(self, ref_wav: Tensor | np.ndarray, ref_rate: int, ref_codes: Tensor, ref_phones: Tensor) -> DiffusionPrompt:
        """A voice's prompt from its reference clip, its semantic tokens and its transcript's phones.

        Parameters
        ----------
        ref_wav:
            ``[N]`` or ``[1, N]`` float mono at ``ref_rate`` (as loaded; no normalisation).
        ref_codes, ref_phones:
            ``[1, 1, Nr]`` and ``[1, P]`` int64.

        Raises
        ------
        ValueError
            the clip or its transcript is too short for one frame (one line, with the fix).
        """
        if ref_phones.numel() == 0:
            raise ValueError(f"{self.family.name} needs the reference's transcript (prompt_text); add it to the voice")
        if ref_codes.numel() == 0:
            raise ValueError("the reference gave no semantic tokens; record a longer reference clip")
        wav = torch.as_tensor(ref_wav).float().reshape(1, -1)
        spec = self.family
        device = self.sovits.codebook.device
        min_samples = spec.mel_fft * ref_rate // spec.mel_rate + 1
        if wav.shape[-1] < min_samples:
            raise ValueError(f"the reference clip is too short ({wav.shape[-1] / ref_rate:.2f} s); record 3 to 10 s")
        ge = self.sovits.ref_style(reference_spec_input(resample(wav, ref_rate, STYLE_RATE)).to(device))
        features = self.sovits.features(ref_codes.to(device), ref_phones.to(device), ge)
        mel = norm_spec(log_mel(resample(wav, ref_rate, spec.mel_rate), spec.mel_rate, spec.mel_fft, spec.mel_hop))
        return DiffusionPrompt(ge=ge, prompt=MelPrompt.from_reference(features, mel.to(device), spec))

    def stored_prompt(self, ge: np.ndarray, codes: np.ndarray, phones: np.ndarray, ref_mel: np.ndarray
                      ) -> DiffusionPrompt:
        """A voice's prompt from what its store keeps (the engine's way; :meth:`prompt` starts from the clip).

        Parameters
        ----------
        ge:
            ``[gin, 1]`` float32 style vector.
        codes, phones:
            ``[Nr]`` int64 reference tokens and ``[P]`` int64 transcript phones.
        ref_mel:
            ``[100, R]`` float32 normalised log-mel (``DiffusionEngine.reference_mel``).

        Raises
        ------
        ValueError
            the reference gives no frame (one line, with the fix).
        """
        device = self.sovits.codebook.device
        style = torch.as_tensor(np.asarray(ge, np.float32), device=device).view(1, -1, 1)
        tokens = torch.as_tensor(np.asarray(codes, np.int64), device=device).view(1, 1, -1)
        text = torch.as_tensor(np.asarray(phones, np.int64), device=device).view(1, -1)
        features = self.sovits.features(tokens, text, style)
        mel = torch.as_tensor(np.asarray(ref_mel, np.float32), device=device)[None].to(features.dtype)
        return DiffusionPrompt(ge=style, prompt=MelPrompt.from_reference(features, mel, self.family))

    def mel(self, codes: Tensor, phones: Tensor, voice: DiffusionPrompt, steps: int | None = None,
            cfg: float | None = None, speed: float = 1.0, noise: NoiseSource | None = None,
            generator: torch.Generator | None = None) -> Tensor:
        """A sentence's normalised mel ``[1, 100, T]`` (steps/cfg default to the family's; see :func:`check_sampling`)."""
        n, rate = check_sampling(self.family, steps, cfg)
        device = self.sovits.codebook.device
        features = self.sovits.features(codes.to(device), phones.to(device), voice.ge, speed)
        return synthesize_mel(self.estimator, voice.prompt, features, self.family, n, rate, noise, generator)

    def vocode(self, mel: Tensor) -> Tensor:
        """Normalised mel ``[1, 100, T]`` -> waveform ``[T * hop]`` float32 at :attr:`sample_rate`."""
        return self.vocoder(denorm_spec(mel))[0, 0].float()

    def decode(self, codes: Tensor, phones: Tensor, voice: DiffusionPrompt, steps: int | None = None,
               cfg: float | None = None, speed: float = 1.0, noise: NoiseSource | None = None,
               generator: torch.Generator | None = None) -> Tensor:
        """A sentence's waveform ``[T * hop]`` float32 (upstream: one vocoder call over the whole mel)."""
        return self.vocode(self.mel(codes, phones, voice, steps, cfg, speed, noise, generator))

    def stream(self, codes: Tensor, phones: Tensor, voice: DiffusionPrompt, steps: int | None = None,
               cfg: float | None = None, speed: float = 1.0, noise: NoiseSource | None = None,
               generator: torch.Generator | None = None, context: int = STREAM_CONTEXT) -> Iterator[Tensor]:
        """A sentence's waveform in pieces, one per sampler chunk (the first after the first chunk's steps).

        Each piece is vocoded with ``context`` mel frames on both sides, and the last ``context`` frames of a chunk
        wait for the next one, so the joined pieces equal :meth:`decode`'s waveform (to float rounding).

        Yields
        ------
        Tensor
            ``[n * hop]`` float32 at :attr:`sample_rate`; together, :meth:`decode`'s samples.
        """
        n, rate = check_sampling(self.family, steps, cfg)
        device = self.sovits.codebook.device
        features = self.sovits.features(codes.to(device), phones.to(device), voice.ge, speed)
        hop = self.family.vocoder_hop
        mel: Tensor | None = None
        done = 0  # frames whose samples were yielded
        total = int(features.shape[-1])
        for chunk in iter_mel_chunks(self.estimator, voice.prompt, features, self.family, n, rate, noise, generator):
            mel = chunk if mel is None else torch.cat((mel, chunk), dim=-1)
            have = int(mel.shape[-1])
            ready = have if have >= total else have - context  # the last chunk has no next one to wait for
            if ready > done:
                yield self._piece(mel, done, ready, context, hop)
                done = ready

    def _piece(self, mel: Tensor, start: int, end: int, context: int, hop: int) -> Tensor:
        """Samples of frames ``[start, end)``, vocoded with up to ``context`` frames of mel on each side."""
        lo, hi = max(0, start - context), min(int(mel.shape[-1]), end + context)
        wav = self.vocode(mel[..., lo:hi])
        return wav[(start - lo) * hop : (end - lo) * hop]
