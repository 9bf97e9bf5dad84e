"""The engine of the diffusion families (v4, v5turbo, v5dev, v3): the s1 GPT as every other engine runs it, and the
SoVITS decode of :class:`~engines.gpt_sovits.diffusion.DiffusionDecoder` (features -> DiT sampled in chunks -> mel ->
vocoder) in torch.

Their GPT is v2's class and format, so it runs exactly as in :class:`~engines.torch_engine.TorchEngine` (the static
KV cache, continuous batching, the fused CPU step and int8 where the engine plan says): the ``torch`` and ``onnx``
backends both build this engine for these files and differ only in name. A voice carries its reference mel
(:meth:`DiffusionEngine.reference_mel`); its encoder features are recomputed from its tokens, phones and style when
it is first used and kept for the next sentences (a few voices, least recently used first out).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import torch

from engines.base import ChunkCallback, EngineError, ModelFormatError, ModelPaths, SemanticBatch, VoicePrompt
from engines.encoders import LazyEncoders, encode_reference
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.cfm import NoiseSource, check_sampling
from engines.gpt_sovits.checkpoint import file_fingerprint, model_id, require_model_files
from engines.gpt_sovits.diffusion import DiffusionDecoder, DiffusionPrompt
from engines.gpt_sovits.dit_checkpoint import is_lora_file
from engines.gpt_sovits.generate import MAX_CONTEXT, SYNC_EVERY, BatchDecoder, CudaGraphStep, SlotBatch
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.mel import log_mel, mel_frames, norm_spec, resample
from engines.gpt_runner import load_gpt
from engines.plan import EnginePlan, Settings, plan_engine, probe_machine
from engines.runtime import use_lane_stream

log = logging.getLogger(__name__)

__all__ = ["DiffusionEngine", "vocoder_fingerprint"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROMPT_CACHE = 16  # voices whose reference features stay computed (each a few hundred kB at released size)
MEL_DIM = 100


def vocoder_fingerprint(path: str | Path) -> str:
    """The identity of a vocoder file, or of v3's BigVGAN folder (its weights and its config)."""
    p = Path(path)
    if p.is_dir():
        return ":".join(file_fingerprint(p / name) for name in ("bigvgan_generator.pt", "config.json"))
    return file_fingerprint(p)


def require_vocoder(vocoder: Path) -> None:
    """EngineError (one line, what to do) when the diffusion family's vocoder file is not there."""
    if not vocoder.exists():
        raise EngineError(f"the vocoder {vocoder} does not exist: run `python -m bot models download`, or point "
                          "models.vocoder in config.yaml at it")


class DiffusionEngine:
    """GPT-SoVITS v4/v5turbo/v5dev/v3: the GPT and the diffusion decoder. Thread-safety: the GPT and the rest may run
    on two threads at once.

    Parameters
    ----------
    gpt:
        the s1 GPT.
    decoder:
        the family's SoVITS and vocoder.
    plan:
        what runs (its backend, ``torch`` or ``onnx``, is the engine's name).
    """

    max_context = MAX_CONTEXT

    def __init__(self, gpt: Text2SemanticModel, decoder: DiffusionDecoder, plan: EnginePlan, *, model_id: str,
                 hubert_path: Path | None = None, bert_path: Path | None = None) -> None:
        self.gpt = gpt
        self.decoder = decoder
        self.plan = plan
        self.name = plan.backend
        self.device = device = plan.device
        self.precision = plan.precision
        self.model_id = model_id
        self.family = decoder.family.name
        self.sample_rate = decoder.sample_rate
        self.max_batch = plan.max_batch
        self.threads = plan.threads
        self.cuda_graphs = plan.gpt_runner == "cuda-graphs"
        self._dtype = DTYPES.get(plan.precision, torch.float32) if device.startswith("cuda") else torch.float32
        self.encoders = LazyEncoders(hubert_path, bert_path, device, self._dtype)
        self._prompts: OrderedDict[bytes, DiffusionPrompt] = OrderedDict()
        self._prompts_lock = threading.Lock()

    @classmethod
    def from_files(cls, models: ModelPaths, vocoder: Path, *, family: str | None = None, plan: EnginePlan | None = None,
                   name: str = "torch", device: str = "cpu", precision: str = "fp32", max_batch: int = 8,
                   cuda_graphs: bool = True, threads: int = 0, cache_dir: Path | None = None) -> DiffusionEngine:
        """Load the GPT, the SoVITS and the vocoder (HuBERT and BERT load on first use).

        ``family``: the configured family (``None``: detect it from the file); a file of another family is a
        one-line :class:`ModelFormatError`, as is a vocoder that is not the family's. ``plan``: what to build
        (:func:`engines.loader.load_engine` passes it); None: planned here from ``name`` (the backend) and the
        keywords after it (tests and benchmarks). ``cache_dir``: where the int8 DiT's and vocoder's proofs (and the
        vocoder's graph) are kept, so a restart does not prove again; None: proven at every load, the vocoder fp32.
        """
        if plan is None:
            plan = plan_engine(Settings(backend=name, device=device, precision=precision, threads=threads,
                                        max_batch=max_batch, cuda_graphs=cuda_graphs), probe_machine(), diffusion=True)
        require_model_files(models)
        require_vocoder(vocoder)
        base = getattr(models, "sovits_base", None)  # like models.family, optional in a ModelPaths
        decoder = DiffusionDecoder.load(models.sovits, vocoder, family, plan.device,
                                        DTYPES.get(plan.precision, torch.float32), path=plan.diffusion_path,
                                        threads=plan.threads, cache_dir=cache_dir, sovits_base=base,
                                        int8_gemm=plan.int8_gemm or "fbgemm", attention=plan.dit_attention,
                                        cuda_graphs=plan.gpt_runner == "cuda-graphs")  # the plan's CUDA graphs
        if family is not None and decoder.family.name != family:
            raise ModelFormatError(f"{models.sovits} is a {decoder.family.name} SoVITS but models.family is {family}; "
                                   f"set models.family: {decoder.family.name} (or auto)")
        gpt, plan = load_gpt(Path(models.gpt), plan, cache_dir)  # (the plan as it runs: fp32 where int8 missed)
        lora = is_lora_file(models.sovits)
        ident = model_id(models, vocoder_fingerprint(vocoder), f"family:{decoder.family.name}",
                         *([file_fingerprint(base)] if lora and base is not None else []))  # a LoRA is its base too
        log.info("%s engine: %s SoVITS with its %d Hz vocoder on %s (%s; DiT %s, vocoder %s)", plan.backend,
                 decoder.family.name, decoder.sample_rate, plan.device, plan.precision, decoder.precisions["dit"],
                 decoder.precisions["vocoder"])
        return cls(gpt, decoder, plan, model_id=ident, hubert_path=Path(models.hubert), bert_path=Path(models.bert))

    def bind_thread(self) -> None:
        """The calling thread gets the engine's CPU threads (the fused step's team too), or a CUDA stream."""
        if self.device == "cpu":
            if self.threads:
                torch.set_num_threads(self.threads)
                cpu_step.set_threads(self.threads)
        else:
            use_lane_stream(self.device)

    # ---- Engine protocol -------------------------------------------------------------------------------------

    def load_encoder(self, name: Literal["hubert", "bert"]) -> None:
        self.encoders.load(name)

    def encode_speaker(self, refs32k: Sequence[np.ndarray]) -> np.ndarray | None:
        return None  # no speaker-verification features in these families

    @torch.inference_mode()
    def encode_reference(self, wav16k: np.ndarray | None, refs32k: Sequence[np.ndarray],
                         sv_emb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        sovits = self.decoder.sovits
        return encode_reference(self.encoders, wav16k, refs32k, extract_latent=sovits.extract_latent,
                                ref_style=lambda spec, _sv: sovits.ref_style(spec.to(self.device)).float())

    @torch.inference_mode()
    def reference_mel(self, clip: np.ndarray, rate: int) -> np.ndarray | None:
        """``[100, R]`` float32: the clip's normalised log-mel at the family's mel rate (upstream's mel prompt).

        Raises
        ------
        EngineError
            the clip is too short for one mel frame (one line, with the fix).
        """
        spec = self.decoder.family
        wav = resample(np.asarray(clip, np.float32).reshape(-1), rate, spec.mel_rate)
        if wav.shape[-1] <= spec.mel_fft or mel_frames(int(wav.shape[-1]), spec.mel_fft, spec.mel_hop) < 1:
            raise EngineError(f"the reference clip is too short ({clip.size / rate:.2f} s) for a {self.family} "
                              "voice's mel prompt; record 3 to 10 s")
        mel = norm_spec(log_mel(wav, spec.mel_rate, spec.mel_fft, spec.mel_hop))[0]
        return mel.numpy().astype(np.float32)

    @torch.inference_mode()
    def text_features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        return self.encoders.bert().features(norm_text, word2ph)

    def new_gpt(self) -> Text2SemanticModel:
        """The GPT a decode batch drives (one cache: one batch at a time, as the device worker runs them)."""
        return self.gpt

    def open_batch(self, on_chunk: ChunkCallback | None = None) -> SemanticBatch:
        decoder = BatchDecoder(self.gpt, max_slots=self.max_batch, max_len=MAX_CONTEXT, on_chunk=on_chunk,
                               sync_every=1 if self.device == "cpu" else SYNC_EVERY, bucket_rows=self.cuda_graphs)
        if self.cuda_graphs:
            decoder.run_step = CudaGraphStep(decoder)
        return SlotBatch(decoder)

    @torch.inference_mode()
    def decode(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
               noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
               steps: int | None = None, cfg: float | None = None) -> np.ndarray:
        """As the Engine protocol; ``noise_scale`` and ``noise_offset`` are not used (the family fixes its start
        noise; a sentence is sampled whole)."""
        pieces = list(self.decode_stream(tokens, phones, voice, speed, noise_scale, seed, noise_offset, steps=steps,
                                         cfg=cfg))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def decode_stream(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
                      noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
                      steps: int | None = None, cfg: float | None = None) -> Iterator[np.ndarray]:
        """One piece per sampler chunk, the first after the first chunk's steps; together, :meth:`decode`."""
        with torch.inference_mode():
            n, rate = self._sampling(steps, cfg)
            prompt = self._prompt(voice)
            codes, text = self._inputs(tokens, phones, speed)
            pieces = self.decoder.stream(codes, text, prompt, n, rate, speed, self._noise(seed))
        while True:
            with torch.inference_mode():  # each piece is computed when it is asked for
                piece = next(pieces, None)
            if piece is None:
                return
            yield piece.cpu().numpy().astype(np.float32, copy=False)

    # ---- helpers ---------------------------------------------------------------------------------------------

    def _sampling(self, steps: int | None, cfg: float | None) -> tuple[int, float]:
        """The family's (steps, cfg) with the defaults filled in; EngineError (one line) when out of range."""
        try:
            return check_sampling(self.decoder.family, steps, cfg)
        except ValueError as e:
            raise EngineError(str(e)) from None

    def _inputs(self, tokens: np.ndarray, phones: np.ndarray, speed: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[1, 1, N]`` and phones ``[1, P]`` on the device (EngineError for empty ones or a bad speed)."""
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        phones = np.asarray(phones, np.int64).reshape(-1)
        if tokens.size == 0 or phones.size == 0:
            raise EngineError("SoVITS decode needs at least one semantic token and one phone")
        if not speed > 0:
            raise EngineError(f"speed must be > 0, got {speed}")
        dev = self.device
        return (torch.as_tensor(tokens, device=dev).view(1, 1, -1), torch.as_tensor(phones, device=dev).view(1, -1))

    def _noise(self, seed: int | None) -> NoiseSource | None:
        """The sampler's start noise, drawn on the host from ``seed`` chunk after chunk (the same on any device)."""
        if seed is None:
            return None
        gen = torch.Generator().manual_seed(int(seed) & 0xFFFFFFFFFFFFFFFF)
        dev = self.device

        def draw(_chunk: int, frames: int) -> torch.Tensor:
            return torch.randn((1, MEL_DIM, frames), generator=gen).to(dev)

        return draw

    def _prompt(self, voice: VoicePrompt) -> DiffusionPrompt:
        """The voice's style, reference features and mel prompt (computed once per voice, then kept)."""
        self._check_voice(voice)
        assert voice.ref_mel is not None  # _check_voice
        arrays = (voice.prompt_tokens, voice.prompt_phones, voice.ge, voice.ref_mel)
        digest = hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).digest()
        with self._prompts_lock:
            hit = self._prompts.get(digest)
            if hit is not None:
                self._prompts.move_to_end(digest)
                return hit
        try:
            prompt = self.decoder.stored_prompt(voice.ge, voice.prompt_tokens, voice.prompt_phones, voice.ref_mel)
        except ValueError as e:
            raise EngineError(str(e)) from None
        with self._prompts_lock:
            self._prompts[digest] = prompt
            while len(self._prompts) > PROMPT_CACHE:
                self._prompts.popitem(last=False)
        return prompt

    def _check_voice(self, voice: VoicePrompt) -> None:
        """Refuse, in one line, a voice this family cannot speak with."""
        if voice.family != self.family:
            raise EngineError(f"this voice was encoded for a {voice.family} SoVITS, the loaded one is {self.family}; "
                              "re-encode the voice for this model")
        if voice.reference_free:
            raise EngineError(f"{self.family} needs the reference clip's transcript (prompt_text); make the voice "
                              "again with its transcript")
        if voice.ref_mel is None or voice.ref_mel.ndim != 2 or voice.ref_mel.shape[0] != MEL_DIM:
            raise EngineError(f"this voice has no {MEL_DIM}-bin reference mel (VoicePrompt.ref_mel); re-encode the "
                              "voice for this model")
        gin = int(self.decoder.sovits.cfg.gin_channels)
        if voice.ge.size != gin:
            raise EngineError(f"this voice's style vector has {voice.ge.size} values, the loaded SoVITS uses {gin}: "
                              "re-encode the voice for this model")
