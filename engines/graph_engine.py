"""The Engine over exported graphs, shared by the onnx and tensorrt backends: each brings a :class:`GraphRunner`.

The GPT decode loop is :class:`engines.gpt_sovits.generate.BatchDecoder`, the same one the torch engine runs, so
sampling, stopping and continuous batching are upstream's rules by construction; only the two forward passes differ.
:class:`GraphGpt` supplies them from graphs and owns the KV cache: per layer, K ``[rows, H, hd, T]`` (transposed)
and V ``[rows, H, T, hd]`` in one contiguous buffer each, so every layer's slice is bound to the step graph without
a copy. ``T`` follows the decoder's bucketed attention length, and the buffers are re-laid (one copy) only when
the number of rows or that bucket changes. The graph returns the new token's K/V, written in place here.

HuBERT and BERT stay in torch (transformers); the reference spectrogram is computed in torch, outside the graphs.
A v2Pro/v2ProPlus SoVITS's speaker-verification features come from the torch SV model too
(:class:`engines.gpt_sovits.sv.LazySpeakerEncoder`, fp32): like HuBERT it runs once per voice, at enrollment, and its
filter banks are an FFT, which the graphs exclude; the ``ref_style`` graph then fuses them into the clip's style.
A :class:`GraphEngine` may also be given the torch GPT with the fused CPU step instead of the GPT graphs (the onnx
backend does so where the engine plan's GPT runner is ``fused``, see :mod:`engines.onnx_engine`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator, Literal, Protocol, Sequence

import numpy as np
import torch

from engines.base import (BERT_DIM, ChunkCallback, EngineError, ModelPaths, SemanticBatch, VoicePrompt,
                          check_v2_decode, decoded_frames, prior_noise)
from engines.encoders import LazyEncoders, encode_reference
from engines.export import MANIFEST, load_manifest, model_key
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.checkpoint import (V2PRO_VERSIONS, file_fingerprint, load_sovits_checkpoint, model_id,
                                          require_model_files)
from engines.gpt_sovits.generate import MAX_CONTEXT, SYNC_EVERY, BatchDecoder, SlotBatch
from engines.gpt_sovits.gpt import KV_BUCKET, GptConfig, Text2SemanticModel
from engines.gpt_sovits.sv import LazySpeakerEncoder, check_voice, require_sv_model, speaker_features, speaker_rows
from engines.plan import EnginePlan
from engines.runtime import use_lane_stream

log = logging.getLogger(__name__)

__all__ = ["GraphEngine", "GraphGpt", "GraphRunner", "graph_model", "sovits_family"]


# A SoVITS decode longer than this (50 Hz latent frames: 10 s of audio) gives its working memory back after it: ONNX
# Runtime's arena otherwise keeps what the longest decode so far needed, about 17 MB per second of audio. Not after
# every decode: that costs a few % of the vocoder's time (see FINDINGS.md#onnx-runtime-arena).
LARGE_DECODE_FRAMES = 500

class GraphRunner(Protocol):
    """Runs one exported graph on caller-allocated tensors (inputs read, outputs written in place)."""

    device: torch.device
    kv_dtype: torch.dtype  # dtype of the GPT graphs' K/V inputs and outputs

    def run(self, graph: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], *,
            large: bool = False) -> None:
        """Run ``graph``; every tensor is contiguous, on ``device``, in the graph's dtype and shape. ``large``: a run
        far larger than usual, whose working memory the runtime should not keep for later runs."""
        ...


# ---------------------------------------------------------------------------------------------------- GPT over graphs


class GraphGpt:
    """The GPT surface :class:`BatchDecoder` drives (``setup_caches``, ``prefill``, ``decode_step``), over graphs.

    Parameters
    ----------
    runner: runs ``gpt_prefill`` and the step graph.
    spec: the export manifest's ``gpt`` section (layers, heads, head_dim, vocab...).
    step_graph: ``"gpt_step"``, or the int8 variant.

    Notes
    -----
    One instance per decode batch (its cache is its own); used from one thread.
    """

    def __init__(self, runner: GraphRunner, spec: dict[str, Any], step_graph: str = "gpt_step") -> None:
        self.runner = runner
        self.step_graph = step_graph
        self.config = GptConfig(dim=spec["dim"], heads=spec["heads"], layers=spec["layers"],
                                phoneme_vocab=spec["phoneme_vocab"], vocab=spec["vocab"], eos=spec["eos"])
        self.pe_positions = int(spec["pe_positions"])
        dev = self.device = runner.device
        self.bert_dim = BERT_DIM
        self.max_slots = self.max_len = 0
        self.text_len = torch.zeros(0, dtype=torch.long, device=dev)  # [slots] phones of each slot's prefill
        cfg, kv = self.config, runner.kv_dtype
        self._k = torch.zeros(cfg.layers, 0, cfg.heads, cfg.head_dim, 0, dtype=kv, device=dev)  # [L, b, H, hd, T]
        self._v = torch.zeros(cfg.layers, 0, cfg.heads, 0, cfg.head_dim, dtype=kv, device=dev)  # [L, b, H, T, hd]
        self._cols = torch.zeros(0, dtype=torch.long, device=dev)  # [T] 0..T-1

    def setup_caches(self, max_slots: int, max_len: int) -> None:
        """Set the limits (buffers are sized on demand, see the module notes)."""
        if max_len > self.pe_positions:
            raise EngineError(f"a decode context of {max_len} positions exceeds the exported positional table "
                              f"({self.pe_positions}); shorten the sentence or the reference")
        self.max_slots, self.max_len = max(max_slots, self.max_slots), max(max_len, self.max_len)
        if self.text_len.shape[0] < self.max_slots:
            grown = torch.zeros(self.max_slots, dtype=torch.long, device=self.runner.device)
            grown[: self.text_len.shape[0]] = self.text_len
            self.text_len = grown

    def prefill(self, slot: int, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """Run one request's input into cache row ``slot``; returns the first step's ``[vocab]`` fp32 logits."""
        cfg, dev, kv = self.config, self.runner.device, self.runner.kv_dtype
        tx, tp = int(phones.shape[0]), int(prompt.shape[0])
        s = tx + tp
        if s > self.max_len or not 0 <= slot < self.max_slots:
            raise EngineError(f"prefill of {s} positions into slot {slot} exceeds the cache "
                              f"{self.max_slots}x{self.max_len}")
        logits = torch.empty(1, cfg.vocab, dtype=torch.float32, device=dev)
        keys = torch.empty(cfg.layers, cfg.heads, cfg.head_dim, s, dtype=kv, device=dev)
        values = torch.empty(cfg.layers, cfg.heads, s, cfg.head_dim, dtype=kv, device=dev)
        self.runner.run("gpt_prefill", {
            "phones": phones.to(dev, torch.long).reshape(1, tx).contiguous(),
            "bert": bert.to(dev, torch.float32).reshape(1, BERT_DIM, tx).contiguous(),
            "prompt": prompt.to(dev, torch.long).reshape(1, tp).contiguous(),
        }, {"logits": logits, "keys": keys, "values": values})
        rows, length = self._k.shape[1], self._k.shape[4]
        self._relayout(max(rows, slot + 1), max(length, min(self.max_len, -(-(s + 1) // KV_BUCKET) * KV_BUCKET)))
        self._k[:, slot, :, :, :s] = keys
        self._v[:, slot, :, :s, :] = values
        self.text_len[slot] = tx
        return logits[0]

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None = None,
                    kv_len: int = 0) -> torch.Tensor:
        """One token for rows ``0..B-1`` (``slots`` must be None); returns ``[B, vocab]`` fp32 logits.

        ``positions[r]`` is the cache index the row's token is written to; it attends to ``[0, positions[r]]``.
        """
        if slots is not None:
            raise EngineError("the graph GPT decodes rows 0..B-1 only (slots=None)")
        cfg, dev, kv = self.config, self.runner.device, self.runner.kv_dtype
        b = int(tokens.shape[0])
        t = kv_len or self.max_len
        self._relayout(b, t)
        bias = torch.zeros(b, t, dtype=torch.float32, device=dev)
        bias.masked_fill_(self._cols[None, :] >= positions[:, None], float("-inf"))  # [B, T]
        audio_pos = (positions - self.text_len[:b]).clamp_(min=0)
        inputs = {"tokens": tokens.contiguous(), "audio_pos": audio_pos, "kv_bias": bias}
        for i in range(cfg.layers):
            inputs[f"past_k_{i}"] = self._k[i]
            inputs[f"past_v_{i}"] = self._v[i]
        logits = torch.empty(b, cfg.vocab, dtype=torch.float32, device=dev)
        new_k = torch.empty(cfg.layers, b, cfg.heads, cfg.head_dim, dtype=kv, device=dev)
        new_v = torch.empty_like(new_k)
        self.runner.run(self.step_graph, inputs, {"logits": logits, "new_k": new_k, "new_v": new_v})
        # Rows past the bucket are finished rows awaiting the host sync; their writes go to a harmless last column.
        rows = torch.arange(b, device=dev)
        pos = positions.clamp(max=t - 1)
        self._k[:, rows, :, :, pos] = new_k.transpose(0, 1)  # indexed view is [B, L, H, hd]
        self._v[:, rows, :, pos, :] = new_v.transpose(0, 1)
        return logits

    def _relayout(self, rows: int, length: int) -> None:
        """Resize the cache to ``rows x length`` positions, keeping the overlap (zeros elsewhere: never NaN)."""
        old_rows, old_len = self._k.shape[1], self._k.shape[4]
        if (rows, length) == (old_rows, old_len):
            return
        cfg, dev, kv = self.config, self.runner.device, self.runner.kv_dtype
        k = torch.zeros(cfg.layers, rows, cfg.heads, cfg.head_dim, length, dtype=kv, device=dev)
        v = torch.zeros(cfg.layers, rows, cfg.heads, length, cfg.head_dim, dtype=kv, device=dev)
        r, n = min(rows, old_rows), min(length, old_len)
        k[:, :r, :, :, :n] = self._k[:, :r, :, :, :n]
        v[:, :r, :, :n, :] = self._v[:, :r, :, :n, :]
        self._k, self._v = k, v
        self._cols = torch.arange(length, device=dev)


# ------------------------------------------------------------------------------------------------------- the engine


def sovits_family(models: ModelPaths, onnx_dir: str | os.PathLike[str]) -> str:
    """The SoVITS family (``"v2"``, ``"v2Pro"``, ``"v2ProPlus"``) of ``models``: from its export's manifest when one
    exists (no checkpoint load on a warm start), else from the checkpoint, before any export work is spent on it."""
    folder = Path(onnx_dir) / model_key(models)
    if (folder / MANIFEST).is_file():
        try:
            return str(load_manifest(folder)["sovits"].get("version", "v2"))
        except (EngineError, KeyError):
            pass  # a stale or damaged export: ensure_onnx reports or redoes it
    if not Path(models.sovits).is_file():
        return "v2"  # ensure_onnx names the missing file
    return load_sovits_checkpoint(models.sovits).version  # v3/v4 files are refused here, with the reason


def graph_model(models: ModelPaths, onnx_dir: str | os.PathLike[str]) -> tuple[str, Path | None]:
    """The model id of a graph engine over ``models`` and the SV model file it needs (None for a v2 SoVITS).

    Checked before any export work is spent: a v2Pro/v2ProPlus SoVITS without its SV model is refused as the torch
    engine refuses it, and the id is the torch engine's for the same files (the SV model's bytes included), so a
    voice encoded by one backend fits the other.
    """
    require_model_files(models)
    family = sovits_family(models, onnx_dir)
    if family not in V2PRO_VERSIONS:
        return model_id(models), None
    sv = require_sv_model(models, family)
    return model_id(models, file_fingerprint(sv)), sv


class GraphEngine:
    """GPT-SoVITS v2/v2Pro/v2ProPlus over exported graphs; the Engine protocol for the onnx and tensorrt backends.

    Thread-safety: the GPT and the rest may run on two threads at once (each decode batch owns its cache).
    """

    name = "graph"
    max_context = MAX_CONTEXT

    def __init__(self, runner: GraphRunner, manifest: dict[str, Any], plan: EnginePlan, *, model_id: str,
                 hubert_path: Path | None, bert_path: Path | None, step_graph: str = "gpt_step",
                 gpt: Text2SemanticModel | None = None, sv_path: Path | None = None, vocoder_precision: str = "fp32",
                 int8_bert: tuple[Path, Path] | None = None):
        """``gpt``: the torch GPT with the fused CPU step (None: the GPT graphs); ``vocoder_precision``: the
        ``sovits_decode`` graph's; ``int8_bert``: (GPT file, proof folder) where the plan runs the BERT in int8
        once proven on that GPT."""
        self.runner = runner
        self.gpt = gpt
        self.plan = plan
        self.threads = plan.threads
        self.manifest = manifest
        self.device = device = plan.device
        self.precision = plan.precision
        self.model_id = model_id
        self.max_batch = plan.max_batch
        self.step_graph = step_graph
        self.vocoder_precision = vocoder_precision
        self.sample_rate = int(manifest["sovits"]["sampling_rate"])
        bert_dtype = torch.float16 if plan.bert == "fp16" else torch.float32
        self.encoders = LazyEncoders(hubert_path, bert_path, device, bert_dtype)
        if int8_bert is not None:
            self.encoders.int8_bert_for, self.encoders.int8_bert_store = int8_bert
        self.version = str(manifest["sovits"].get("version", "v2"))
        self.family = self.version
        self.sv_dim = int(manifest["sovits"].get("sv_dim") or 0)  # 0: a v2 SoVITS, which reads no SV features
        # v2Pro/v2ProPlus: the speaker-verification model (checked now, loaded when the first voice is encoded)
        self.speaker = (LazySpeakerEncoder(sv_path, device, self.sv_dim)
                        if self.sv_dim and sv_path is not None else None)

    def bind_thread(self) -> None:
        """Called once by each thread that will run this engine: on a GPU, a CUDA stream of its own; on a CPU with
        the torch GPT, the engine's threads for its prefill (torch) and its steps (the fused step's team). Only this
        thread runs torch work with more than one thread (see :func:`engines.loader.load_engine`)."""
        if self.device.startswith("cuda"):
            use_lane_stream(self.device)
        elif self.gpt is not None:
            torch.set_num_threads(self.threads)
            cpu_step.set_threads(self.threads)

    # ---- Engine protocol -------------------------------------------------------------------------------------

    def load_encoder(self, name: Literal["hubert", "bert"]) -> None:
        self.encoders.load(name)

    def reference_mel(self, clip: np.ndarray, rate: int) -> np.ndarray | None:
        return None  # the v2 families have no mel prompt

    @torch.inference_mode()
    def encode_speaker(self, refs32k: Sequence[np.ndarray]) -> np.ndarray | None:
        """v2Pro/v2ProPlus: the SV features ``[n_refs, sv_dim]`` float32 of each 32 kHz clip (for
        ``VoicePrompt.sv_emb``), from the torch SV model; None for a plain v2 SoVITS, which has no use for them."""
        return speaker_features(self.speaker, self.version, refs32k) if self.sv_dim else None

    @torch.inference_mode()
    def encode_reference(self, wav16k: np.ndarray | None, refs32k: Sequence[np.ndarray],
                         sv_emb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As the Engine protocol; for a v2Pro/v2ProPlus SoVITS each clip's style is fused with its SV features:
        ``sv_emb`` from :meth:`encode_speaker` (computed here when None), row i for ``refs32k[i]``."""
        svs = self._sv_rows(refs32k, sv_emb) if refs32k else None  # v2Pro: [1, sv_dim] per clip; v2: None each
        return encode_reference(self.encoders, wav16k, refs32k, svs=svs, extract_latent=self.extract_latent,
                                ref_style=self.ref_style)

    def _sv_rows(self, refs32k: Sequence[np.ndarray], sv_emb: np.ndarray | None) -> list[torch.Tensor | None]:
        """Each clip's SV features ``[1, sv_dim]`` (``sv_emb``'s rows, or computed), or None per clip for v2."""
        if not self.sv_dim:
            return [None] * len(refs32k)
        feats = speaker_features(self.speaker, self.version, refs32k) if sv_emb is None else sv_emb
        return list(speaker_rows(feats, len(refs32k)))

    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """HuBERT features ``[B, 768, T50]`` -> codes ``[1, B, T50 // 2]`` int64 (graph ``extract_latent``)."""
        dev = self.runner.device
        ssl = ssl.to(dev, torch.float32).contiguous()
        codes = torch.empty(1, ssl.shape[0], ssl.shape[2] // 2, dtype=torch.long, device=dev)
        self.runner.run("extract_latent", {"ssl": ssl}, {"codes": codes})
        return codes

    def ref_style(self, spec: torch.Tensor, sv: torch.Tensor | None = None) -> torch.Tensor:
        """Linear spectrogram ``[B, 1025, Tr]`` -> ``ge [B, gin, 1]`` fp32 (graph ``ref_style``).

        ``sv``: v2Pro/v2ProPlus only, required there: the same clips' SV features ``[B, sv_dim]``; the graph fuses
        them into the style (``PReLU(ref_enc + sv_emb(sv))``).
        """
        dev = self.runner.device
        spec = spec.to(dev, torch.float32).contiguous()
        inputs = {"spec": spec}
        if self.sv_dim:
            if sv is None:
                raise EngineError(f"a {self.version} SoVITS needs the reference's speaker-verification features")
            if sv.shape[-1] != self.sv_dim:
                raise EngineError(f"speaker-verification features have width {sv.shape[-1]}, this {self.version} "
                                  f"SoVITS reads {self.sv_dim}; use the SV model that belongs to it")
            inputs["sv"] = sv.to(dev, torch.float32).reshape(spec.shape[0], self.sv_dim).contiguous()
        elif sv is not None:
            raise EngineError("this is a plain v2 SoVITS: it takes no speaker-verification features")
        ge = torch.empty(spec.shape[0], self.manifest["sovits"]["gin"], 1, dtype=torch.float32, device=dev)
        self.runner.run("ref_style", inputs, {"ge": ge})
        return ge

    @torch.inference_mode()
    def text_features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        return self.encoders.bert().features(norm_text, word2ph)

    def new_gpt(self) -> GraphGpt | Text2SemanticModel:
        """The GPT a decode batch drives: graphs with a KV cache of their own per batch, or the torch GPT with the
        fused step (one cache: one batch at a time, as the device worker runs them)."""
        if self.gpt is not None:
            return self.gpt
        return GraphGpt(self.runner, self.manifest["gpt"], self.step_graph)

    def open_batch(self, on_chunk: ChunkCallback | None = None) -> SemanticBatch:
        # The fused step's EOS flags are host memory: read them every step (no wasted steps).
        decoder = BatchDecoder(self.new_gpt(), max_slots=self.max_batch, max_len=MAX_CONTEXT, on_chunk=on_chunk,
                               sync_every=1 if self.gpt is not None else SYNC_EVERY)
        return SlotBatch(decoder)

    def decode_stream(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
                      noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
                      steps: int | None = None, cfg: float | None = None) -> Iterator[np.ndarray]:
        """The whole decode as one piece (the v2 decoder is one graph run)."""
        yield self.decode(tokens, phones, voice, speed, noise_scale, seed, noise_offset, steps=steps, cfg=cfg)

    @torch.inference_mode()
    def decode(self, tokens: np.ndarray, phones: np.ndarray, voice: VoicePrompt, speed: float = 1.0,
               noise_scale: float = 0.5, seed: int | None = None, noise_offset: int = 0, *,
               steps: int | None = None, cfg: float | None = None) -> np.ndarray:
        check_v2_decode(self.family, voice, steps, cfg)
        # a v2 voice's style must never reach a v2Pro model, nor the reverse (the torch engine's rule and message)
        check_voice(voice, self.version, self.sv_dim, int(self.manifest["sovits"]["gin"]))
        return self.decode_with_noise(tokens, phones, voice.ge, speed, noise_scale, seed,
                                      noise_offset=noise_offset)[0, 0].cpu().numpy()

    def decode_with_noise(self, tokens: np.ndarray, phones: np.ndarray, ge: np.ndarray, speed: float = 1.0,
                          noise_scale: float = 0.5, seed: int | None = None,
                          eps: torch.Tensor | None = None, noise_offset: int = 0) -> torch.Tensor:
        """SoVITS decode (graph ``sovits_decode``) -> ``[1, 1, N]`` fp32 @ 32 kHz.

        The prior noise is drawn as the torch engine draws it (:func:`~engines.base.prior_noise` with ``seed`` and
        ``noise_offset``), or taken from ``eps`` (standard normal, ``[1, C, frames]``) for conformance tests.
        """
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        phones = np.asarray(phones, np.int64).reshape(-1)
        if tokens.size == 0 or phones.size == 0:
            raise EngineError("SoVITS decode needs at least one semantic token and one phone")
        if speed <= 0:
            raise EngineError(f"speed must be > 0, got {speed}")
        dev, spec = self.runner.device, self.manifest["sovits"]
        frames = decoded_frames(tokens.size, speed)  # 50 Hz latent frames
        shape = (1, spec["inter_channels"], frames)
        if noise_scale == 0:
            noise = torch.zeros(shape, dtype=torch.float32)
        else:
            if eps is None:
                eps = torch.as_tensor(prior_noise(seed, shape[1], frames, noise_offset))
            noise = eps.float().reshape(shape) * noise_scale
        wav = torch.empty(1, 1, frames * spec["hop"], dtype=torch.float32, device=dev)
        self.runner.run("sovits_decode", large=frames > LARGE_DECODE_FRAMES, inputs={
            "codes": torch.as_tensor(tokens, device=dev).reshape(1, 1, -1).contiguous(),
            "text": torch.as_tensor(phones, device=dev).reshape(1, -1).contiguous(),
            "ge": torch.as_tensor(np.asarray(ge, np.float32), device=dev).reshape(1, -1, 1).contiguous(),
            "noise": noise.to(dev).contiguous(),
        }, outputs={"wav": wav})
        return wav
