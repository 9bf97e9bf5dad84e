"""The engine interface: the seam between the synthesis pipeline and the tensors.

Everything that crosses this boundary is numpy (or plain Python). No per-user state lives in an engine: a voice is
a :class:`VoicePrompt` the caller keeps and passes in with every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Literal, Protocol, Sequence

import numpy as np

from engines.gpt_sovits.family import DIT_FAMILIES, MAX_CFG, family_spec

SAMPLE_RATE = 32000  # Hz, SoVITS v2 output rate
SSL_SAMPLE_RATE = 16000  # Hz, HuBERT input rate
SAMPLES_PER_TOKEN = 1280  # samples @ 32 kHz per semantic token (25 Hz)
FRAME_SAMPLES = SAMPLES_PER_TOKEN // 2  # samples per SoVITS latent frame (50 Hz, two per token at speed 1)
EOS_TOKEN = 1024  # the GPT's end-of-sequence id (vocab 1025)
MAX_DECODE_STEPS = 1500  # upstream's hard cap on GPT steps per sentence (60 s of audio)
BERT_DIM = 1024  # chinese-roberta-wwm-ext-large hidden size
MAX_TEMPERATURE = 100.0  # sampling temperature bound (upstream's UI offers 0-1; beyond 100 is uniform noise)
MAX_REPETITION_PENALTY = 100.0  # repetition penalty bound (upstream's default is 1.35)
DIFFUSION_FAMILIES = DIT_FAMILIES  # SoVITS families that decode through a DiT and a vocoder (the rest: v2's HiFi-GAN)


def decoded_frames(tokens: int, speed: float) -> int:
    """Latent frames (50 Hz, :data:`FRAME_SAMPLES` samples each) of a SoVITS decode of ``tokens`` semantic tokens
    at ``speed``: two per token, or at speed != 1 upstream's linear interpolation of them to ``int(2 tokens / speed) + 1``
    frames."""
    return 2 * tokens if speed == 1 else int(2 * tokens / speed) + 1


def token_sample(k: int, tokens: int, speed: float) -> int:
    """The sample at which token ``k`` (``0 <= k <= tokens``) begins in the audio of a SoVITS decode of ``tokens``
    tokens at ``speed``: ``k * SAMPLES_PER_TOKEN`` at speed 1. Otherwise the interpolation (``align_corners=False``)
    maps frame edges linearly, the source's ``2k`` (token ``k``'s first frame) to ``k * frames / tokens``, and this is
    the frame edge nearest to it: a decode's waveform is laid out frame by frame, so two decodes of the same tokens
    join in phase at frame edges, wherever each one's interpolation put its frames (real size, noise-free: pieces cut
    at the exact position correlated 0.5-0.7 past the joint, at the nearest frame edges 0.99-1.0)."""
    if speed == 1:
        return k * SAMPLES_PER_TOKEN
    return int(round(k * decoded_frames(tokens, speed) / tokens)) * FRAME_SAMPLES


def prior_noise(seed: int | None, channels: int, frames: int, offset: int = 0) -> np.ndarray:
    """The SoVITS prior's standard-normal noise ``[1, channels, frames]`` float32: frames ``offset`` to ``offset +
    frames`` of the stream of ``seed`` (None: unseeded), drawn frame after frame, so that a piece of a sentence
    decoded on its own can have the noise the rest of the sentence has at the same frames (``Engine.decode``'s
    ``noise_offset``). Real size, default noise scale 0.5, speed 1: two pieces' samples at a hand-over agreed to
    18-20 dB with it, 7 dB when each piece drew its noise from frame 0."""
    rng = np.random.default_rng(None if seed is None else int(seed) & 0xFFFFFFFFFFFFFFFF)
    drawn = rng.standard_normal((offset + frames, channels), dtype=np.float32)  # element after element: a prefix is
    return np.ascontiguousarray(drawn[offset:].T[None])  # the same whatever is drawn after it


class SpeechError(Exception):
    """Root of every error this project raises on purpose; the message says what to fix."""


class EngineError(SpeechError):
    """An engine failed (bad model file, backend failure, unsupported feature)."""


class ModelFormatError(EngineError):
    """A checkpoint is unreadable, unsafe, or of a model version we do not support."""


@dataclass(frozen=True)
class VoicePrompt:
    """Everything the model needs about a reference voice, precomputed once per voice.

    Attributes
    ----------
    prompt_tokens:
        ``[Tp]`` int64, the reference's semantic tokens (HuBERT + VQ). Empty for reference-free mode.
    ge:
        ``[gin, 1]`` float32, the global style embedding from the reference spectrogram(s) (averaged).
    prompt_phones:
        ``[Tpp]`` int64, phone ids of the reference transcript. Empty for reference-free mode.
    prompt_bert:
        ``[1024, Tpp]`` float32, BERT features of the reference transcript (zeros for non-Chinese).
    sv_emb:
        ``[n_refs, sv_dim]`` float32, the speaker-verification features of each reference clip, present exactly when
        the voice was encoded for a v2Pro/v2ProPlus SoVITS (its ``ge`` is then already fused with them); None for v2.
    family:
        the SoVITS family that encoded it (``v2``, ``v2Pro``, ``v2ProPlus``, ``v3``, ``v4``, ``v5dev``,
        ``v5turbo``): a prompt of one family never conditions another.
    ref_mel:
        ``[100, R]`` float32, the reference's normalised log-mel at the family's mel rate (``Engine.reference_mel``),
        the diffusion families' audio prompt; None for the v2 families. The reference's encoder features are not
        stored: the engine computes them from the tokens, phones and ``ge`` when the voice is used.
    """

    prompt_tokens: np.ndarray
    ge: np.ndarray
    prompt_phones: np.ndarray
    prompt_bert: np.ndarray
    sv_emb: np.ndarray | None = None
    family: str = "v2"
    ref_mel: np.ndarray | None = None

    @property
    def reference_free(self) -> bool:
        return self.prompt_tokens.size == 0 or self.prompt_phones.size == 0


@dataclass(frozen=True)
class SamplingParams:
    """Per-request GPT sampling options (upstream's names and defaults)."""

    top_k: int = 15
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35
    seed: int | None = None  # None: nondeterministic
    early_stop_num: int = -1  # -1: only the 1500-step cap applies

    def __post_init__(self) -> None:
        # Checked here, at the door, so that a bad value fails its own request with a clear message instead of
        # failing inside a running decode batch (where it would take every request in the batch down with it).
        if not _whole(self.top_k) or self.top_k < 1:
            raise ValueError(f"top_k must be a whole number >= 1, got {self.top_k!r}")
        _check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_range("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, MAX_REPETITION_PENALTY, low_open=True)
        if self.seed is not None and not _whole(self.seed):
            raise ValueError(f"seed must be a whole number or None, got {self.seed!r}")
        if not _whole(self.early_stop_num):
            raise ValueError(f"early_stop_num must be a whole number, got {self.early_stop_num!r}")


def _whole(value: object) -> bool:
    """An int or numpy integer, not a bool (``object``: the declared type is not trusted at the door)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_range(name: str, value: object, lo: float, hi: float, *, low_open: bool = False) -> None:
    """Refuse a value that is not a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``low_open``)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    v = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not (math.isfinite(v) and (lo < v if low_open else lo <= v) and v <= hi):
        interval = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")


@dataclass(frozen=True)
class SemanticRequest:
    """One sentence for the GPT.

    Attributes
    ----------
    phones: ``[Tx]`` int64 target phone ids (without the prompt's phones).
    bert: ``[1024, Tx]`` float32 BERT features of the target phones.
    voice: the voice whose prompt tokens/phones condition the GPT.
    params: sampling options; ``params.seed`` makes the run reproducible regardless of batching.
    """

    phones: np.ndarray
    bert: np.ndarray
    voice: VoicePrompt
    params: SamplingParams = field(default_factory=SamplingParams)


# on_chunk(request_index, new_tokens) is called from the engine's thread as tokens become available.
ChunkCallback = Callable[[int, np.ndarray], None]
# should_stop(request_index) -> True cancels that request; checked between decode steps.
StopFlag = Callable[[int], bool]


class ModelPaths(Protocol):
    """Where a model set's files are (``bot.config.ModelsConfig`` satisfies it)."""

    # read-only properties, so that a frozen dataclass (the config) satisfies it
    @property
    def gpt(self) -> Path: ...
    @property
    def sovits(self) -> Path: ...
    @property
    def hubert(self) -> Path: ...
    @property
    def bert(self) -> Path: ...
    @property
    def sv(self) -> Path: ...  # the speaker-verification model; read only when the SoVITS is v2Pro/v2ProPlus


class SemanticBatch(Protocol):
    """A running GPT decode batch that requests join and leave between steps (continuous batching).

    Used from one thread only (the scheduler's GPT lane).
    """

    @property
    def active(self) -> int:
        """Requests currently decoding."""
        ...

    @property
    def capacity(self) -> int:
        """Most requests that can decode together."""
        ...

    def add(self, request_id: int, request: SemanticRequest) -> None:
        """Prefill ``request`` and start decoding it from the next step."""
        ...

    def step(self) -> list[tuple[int, np.ndarray]]:
        """Advance every active request by one or more tokens; return the ``(request_id, tokens [Ts])`` that finished."""
        ...

    def cancel(self, request_id: int) -> None:
        """Drop a request; its slot is free for the next ``add``."""
        ...


class PlanLabels(Protocol):
    """What the pipeline reads of an engine's plan (:class:`engines.plan.EnginePlan`)."""

    def labels(self) -> dict[str, str]:
        """The plan as string labels (``/metrics``' engine info)."""
        ...


class Engine(Protocol):
    """A GPT-SoVITS backend (one GPT and one SoVITS of any family). Implementations: torch, onnx, tensorrt (see
    ``load_engine``)."""

    name: str  # "torch", "onnx", "tensorrt"
    device: str  # "cpu", "cuda:0", ...
    precision: str  # "fp32", "fp16", "bf16", "int8"
    model_id: str  # stable identity of the loaded weights (hash; the vocoder's too), for cache keys
    family: str  # the loaded SoVITS's family: v2, v2Pro, v2ProPlus, v3, v4, v5dev, v5turbo
    sample_rate: int  # Hz of decode's output: 32000 (v2 families), 48000 (v4, v5), 24000 (v3)
    max_context: int  # GPT positions per request: reference phones and tokens, the sentence's phones and tokens

    @property
    def plan(self) -> PlanLabels:
        """What runs (:class:`engines.plan.EnginePlan`): logged at start, shown in ``/metrics``."""
        ...

    def load_encoder(self, name: Literal["hubert", "bert"]) -> None:
        """Load HuBERT (voices are made with it) or the Chinese BERT now, from any thread, so that the first request
        that needs it does not stall the device thread for the seconds a load takes."""
        ...

    def reference_mel(self, clip: np.ndarray, rate: int) -> np.ndarray | None:
        """The diffusion families' audio prompt of a reference clip ``[N]`` float32 at ``rate`` Hz: its normalised
        log-mel ``[100, R]`` float32 at the family's mel rate (the raw clip, not loudness-normalised, as upstream);
        None for the v2 families."""
        ...

    def encode_speaker(self, refs32k: Sequence[np.ndarray]) -> np.ndarray | None:
        """v2Pro/v2ProPlus: the speaker-verification features ``[n_refs, sv_dim]`` float32 of each 32 kHz clip (for
        ``VoicePrompt.sv_emb`` and ``encode_reference``); None for a plain v2 SoVITS, which does not use them."""
        ...

    def encode_reference(self, wav16k: np.ndarray | None, refs32k: Sequence[np.ndarray],
                         sv_emb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Reference audio -> (prompt_tokens ``[Tp]`` int64, ge ``[gin, 1]`` float32).

        ``wav16k``: ``[N]`` float32 @ 16 kHz, 3-10 s (None: no prompt tokens, reference-free).
        ``refs32k``: one or more ``[N]`` float32 @ 32 kHz clips for ``ge`` (averaged).
        ``sv_emb``: v2Pro/v2ProPlus: ``encode_speaker(refs32k)``, fused into each clip's style (computed when None);
        ignored by a v2 SoVITS.
        """
        ...

    def text_features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        """Chinese BERT features: ``[1024, sum(word2ph)]`` float32."""
        ...

    def bind_thread(self) -> None:
        """Called once by each thread that will run this engine (CPU thread counts; a CUDA stream on a GPU)."""
        ...

    def open_batch(self, on_chunk: ChunkCallback | None = None) -> SemanticBatch:
        """A continuous-batching GPT decoder (the scheduler drives it step by step)."""
        ...

    def decode(
        self,
        tokens: np.ndarray,
        phones: np.ndarray,
        voice: VoicePrompt,
        speed: float = 1.0,
        noise_scale: float = 0.5,
        seed: int | None = None,
        noise_offset: int = 0,
        *,
        steps: int | None = None,
        cfg: float | None = None,
    ) -> np.ndarray:
        """Semantic tokens ``[Ts]`` + target phones ``[Tx]`` -> waveform ``[N]`` float32 at :attr:`sample_rate`.

        ``seed`` makes the noise reproducible: for the v2 families it is :func:`prior_noise` of the seed from latent
        frame ``noise_offset`` on (a piece of a sentence gets the noise the sentence has at its frames); for the
        diffusion families the sampler's start noise (their scale is fixed per family: ``noise_scale`` is ignored).
        ``steps``/``cfg``: the diffusion sampler's steps and guidance (None: the family's defaults); a v2 family
        refuses them."""
        ...

    def decode_stream(
        self,
        tokens: np.ndarray,
        phones: np.ndarray,
        voice: VoicePrompt,
        speed: float = 1.0,
        noise_scale: float = 0.5,
        seed: int | None = None,
        noise_offset: int = 0,
        *,
        steps: int | None = None,
        cfg: float | None = None,
    ) -> Iterator[np.ndarray]:
        """:meth:`decode` in pieces as they are made (a diffusion family: one per sampler chunk; a v2 family may
        yield the whole decode as one piece); the pieces joined equal :meth:`decode`'s waveform."""
        ...


def check_v2_decode(family: str, voice: VoicePrompt, steps: int | None, cfg: float | None) -> None:
    """Refuse, in one line, what a v2-family SoVITS cannot do: a sampler's ``steps``/``cfg``, or a voice encoded for a
    diffusion family (its style and mel prompt mean nothing to this model)."""
    if steps is not None or cfg is not None:
        raise EngineError(f"steps and cfg set the sampler of the v3/v4/v5 models; the loaded {family} SoVITS has "
                          "none: leave them unset (or load a v4/v5 model)")
    if voice.family in DIFFUSION_FAMILIES:
        raise EngineError(f"this voice was encoded for a {voice.family} SoVITS, the loaded one is {family}; "
                          "re-encode the voice for this model")


def check_sampler(family: str, steps: int | None, cfg: float | None) -> None:
    """Refuse, in one line and before any model work, sampler options ``family`` does not accept (the engine checks
    them again): v5dev/v5turbo take 4, 8, 16 or 32 steps and cfg in [0, 2], v3/v4 any steps >= 1 (cfg unused).
    A :class:`SpeechError` (not an engine failure: the request's own values are wrong)."""
    if family not in DIFFUSION_FAMILIES:
        return
    allowed = family_spec(family).allowed_steps
    if steps is not None:
        if allowed and steps not in allowed:
            raise SpeechError(f"{family} samples in {', '.join(map(str, allowed))} steps, not {steps}; "
                              "set steps (api_v2 sample_steps) to one of them")
        if steps < 1:
            raise SpeechError(f"steps must be at least 1, got {steps}")
    if cfg is not None and not (math.isfinite(cfg) and 0.0 <= cfg <= MAX_CFG):
        raise SpeechError(f"cfg (api_v2 cfg_rate) must be between 0 and {MAX_CFG:g}, got {cfg}")
