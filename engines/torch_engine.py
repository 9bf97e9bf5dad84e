"""The PyTorch backend (CPU and CUDA): the GPT with a static KV cache and continuous batching, SoVITS, HuBERT, BERT."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import torch

from engines.base import (SAMPLE_RATE, ChunkCallback, EngineError, ModelPaths, SemanticBatch, VoicePrompt,
                          check_v2_decode, decoded_frames, prior_noise)
from engines.encoders import LazyEncoders, encode_reference
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.checkpoint import (file_fingerprint, load_sovits_checkpoint, model_id,
                                          require_model_files)
from engines.gpt_sovits.generate import MAX_CONTEXT, SYNC_EVERY, BatchDecoder, CudaGraphStep, SlotBatch
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.sovits import SoVITSDecoder
from engines.gpt_sovits.sv import LazySpeakerEncoder, check_voice, require_sv_model, speaker_features, speaker_rows
from engines.gpt_runner import load_gpt
from engines.plan import EnginePlan, Settings, plan_engine, probe_machine
from engines.runtime import use_lane_stream

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchEngine:
    """GPT-SoVITS v2 on PyTorch. Thread-safety: the GPT and the rest may run on two threads at once."""

    name = "torch"
    sample_rate = SAMPLE_RATE  # Hz: the v2 families' HiFi-GAN
    max_context = MAX_CONTEXT

    def __init__(self, gpt: Text2SemanticModel, sovits: SoVITSDecoder, plan: EnginePlan, *, model_id: str,
                 hubert_path: Path | None = None, bert_path: Path | None = None, sv_path: Path | None = None,
                 gpt_path: Path | None = None) -> None:
        self.gpt = gpt
        self.sovits = sovits
        self.plan = plan
        self.device = plan.device
        self.precision = plan.precision
        self.model_id = model_id
        self.family = sovits.cfg.version
        self.max_batch = plan.max_batch
        self.threads = plan.threads
        self.cuda_graphs = plan.gpt_runner == "cuda-graphs"
        device = plan.device
        self._sovits_dtype = DTYPES.get(plan.precision, torch.float32)
        self._owner: int | None = None  # the thread bind_thread gave the CPU threads to
        self._warned_thread = False
        # HuBERT/BERT in the SoVITS precision on GPU, fp32 on CPU
        self.encoders = LazyEncoders(hubert_path, bert_path, device,
                                     self._sovits_dtype if device.startswith("cuda") else torch.float32)
        if plan.bert == "int8-if-proven":  # the Chinese BERT in int8 too, where it proves itself on this GPT
            self.encoders.int8_bert_for = gpt_path
        # v2Pro/v2ProPlus: the speaker-verification model, loaded when the first voice is encoded
        self.speaker = (LazySpeakerEncoder(sv_path, device, sovits.cfg.sv_dim)
                        if sovits.cfg.is_v2pro and sv_path is not None else None)

    @classmethod
    def from_files(cls, models: ModelPaths, plan: EnginePlan | None = None, *, device: str = "cpu",
                   precision: str = "fp32", max_batch: int = 8, cuda_graphs: bool = True,
                   threads: int = 0, proofs: Path | None = None) -> TorchEngine:
        """Load the GPT and SoVITS checkpoints (HuBERT, BERT and a v2Pro SoVITS's SV model load on first use).

        ``plan``: what to build (:func:`engines.loader.load_engine` passes it); None: planned here from the keywords
        (tests and benchmarks), with the GPT runner ``auto``. ``proofs``: where the int8 GPT's proof is kept
        (:func:`engines.gpt_runner.load_gpt`; None: proven at every load).
        """
        if plan is None:
            plan = plan_engine(Settings(backend="torch", device=device, precision=precision, threads=threads,
                                        max_batch=max_batch, cuda_graphs=cuda_graphs), probe_machine())
        require_model_files(models)
        gpt, plan = load_gpt(Path(models.gpt), plan, proofs)  # (the plan as it runs: fp32 where int8 missed)
        sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(models.sovits), plan.device,
                                               DTYPES.get(plan.precision, torch.float32))
        more: list[str] = []
        sv_path: Path | None = None
        if sovits.cfg.is_v2pro:  # its voices' style depends on the SV model too, so it is part of the identity
            sv_path = require_sv_model(models, sovits.cfg.version)
            more.append(file_fingerprint(sv_path))
        return cls(gpt, sovits, plan, model_id=model_id(models, *more), hubert_path=Path(models.hubert),
                   bert_path=Path(models.bert), sv_path=sv_path, gpt_path=Path(models.gpt))

    def bind_thread(self) -> None:
        """Called once by the thread that will run this engine: give it the engine's CPU threads.

        torch also makes this count the default of threads that first run torch work later, so on a CPU no other
        thread may run torch work after this (see :func:`engines.loader.load_engine`): the engine warns once if one
        does. On a GPU the calling thread gets a CUDA stream of its own."""
        if self.device == "cpu":
            self._owner = threading.get_ident()
            if self.threads:
                torch.set_num_threads(self.threads)
                cpu_step.set_threads(self.threads)
        else:
            use_lane_stream(self.device)

    def _check_thread(self) -> None:
        """Warn (once) when CPU torch work runs outside the bound thread: it makes every later GPT step ~2x slower."""
        if self._owner is not None and threading.get_ident() != self._owner and not self._warned_thread:
            self._warned_thread = True
            log.warning("the torch engine was called from thread %r, not from the thread it is bound to: on a CPU "
                        "two threads running torch work slow every later GPT step about 2x; call the engine "
                        "only from the synthesis worker", threading.current_thread().name)

    # ---- Engine protocol -------------------------------------------------------------------------------------

    def load_encoder(self, name: Literal["hubert", "bert"]) -> None:
        self.encoders.load(name)

    def reference_mel(self, clip: np.ndarray, rate: int) -> np.ndarray | None:
        return None  # the v2 families have no mel prompt

    @torch.inference_mode()
    def encode_speaker(self, refs32k: Sequence[np.ndarray]) -> np.ndarray | None:
        """v2Pro/v2ProPlus: the SV features ``[n_refs, sv_dim]`` float32 of each 32 kHz clip (for
        ``VoicePrompt.sv_emb``); None for a plain v2 SoVITS, which has no use for them."""
        self._check_thread()
        if not self.sovits.cfg.is_v2pro:
            return None
        return speaker_features(self.speaker, self.sovits.cfg.version, refs32k)

    @torch.inference_mode()
    def encode_reference(self, wav16k: np.ndarray | None, refs32k: Sequence[np.ndarray],
                         sv_emb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As the Engine protocol; for a v2Pro/v2ProPlus SoVITS each clip's style is fused with its SV features:
        ``sv_emb`` from :meth:`encode_speaker` (computed here when None), row i for ``refs32k[i]``."""
        self._check_thread()
        svs: list[torch.Tensor | None] | None = None
        if refs32k and self.sovits.cfg.is_v2pro:
            feats = speaker_features(self.speaker, self.sovits.cfg.version, refs32k) if sv_emb is None else sv_emb
            svs = list(speaker_rows(feats, len(refs32k), self.device))
        return encode_reference(
            self.encoders, wav16k, refs32k, svs=svs,
            extract_latent=lambda ssl: self.sovits.extract_latent(ssl.to(self._sovits_dtype)),
            ref_style=lambda spec, sv: self.sovits.ref_style(spec.to(self.device), sv))

    @torch.inference_mode()
    def text_features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        self._check_thread()
        return self.encoders.bert().features(norm_text, word2ph)

    def new_gpt(self) -> Text2SemanticModel:
        """The GPT a decode batch drives (one cache: one batch at a time, as the device worker runs them)."""
        return self.gpt

    def open_batch(self, on_chunk: ChunkCallback | None = None) -> SemanticBatch:
        self._check_thread()
        # A host read costs nothing on the CPU, so check for EOS every step there (no wasted steps).
        decoder = BatchDecoder(self.gpt, max_slots=self.max_batch, max_len=MAX_CONTEXT, on_chunk=on_chunk,
                               sync_every=1 if self.device == "cpu" else SYNC_EVERY, bucket_rows=self.cuda_graphs)
        if self.cuda_graphs:
            decoder.run_step = CudaGraphStep(decoder)
        return SlotBatch(decoder)

    def decode_stream(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
                      noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
                      steps: int | None = None, cfg: float | None = None) -> Iterator[np.ndarray]:
        """The whole decode as one piece (the v2 decoder is one parallel pass)."""
        yield self.decode(tokens, phones, voice, speed, noise_scale, seed, noise_offset, steps=steps, cfg=cfg)

    @torch.inference_mode()
    def decode(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
               noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
               steps: int | None = None, cfg: float | None = None) -> np.ndarray:
        self._check_thread()
        check_v2_decode(self.family, voice, steps, cfg)
        model = self.sovits.cfg  # a v2 voice's style must never reach a v2Pro model, nor the reverse
        check_voice(voice, model.version, model.sv_dim, model.gin_channels)
        if np.asarray(tokens).size == 0 or np.asarray(phones).size == 0:  # as the graph engines say it
            raise EngineError("SoVITS decode needs at least one semantic token and one phone")
        dev = self.device
        codes = torch.as_tensor(np.asarray(tokens, np.int64), device=dev).view(1, 1, -1)
        text = torch.as_tensor(np.asarray(phones, np.int64), device=dev).view(1, -1)
        ge = torch.as_tensor(np.asarray(voice.ge, np.float32), device=dev).view(1, -1, 1)
        eps = None
        if noise_scale != 0:  # the graph engines' draw (on the host: the same numbers on any device)
            frames = decoded_frames(codes.shape[-1], speed)
            eps = torch.as_tensor(prior_noise(seed, model.inter_channels, frames, noise_offset), device=dev)
        wav = self.sovits.decode(codes, text, ge.to(self._sovits_dtype), speed=speed, noise_scale=noise_scale,
                                 eps=eps)
        return wav[0, 0].float().cpu().numpy()
