"""The GPT-SoVITS v2 GPT (upstream ``Text2SemanticDecoder``) with a preallocated, slot-addressed KV cache.

Maths as upstream (reference section 5): text embedding + BERT projection + alpha-scaled interleaved sin/cos
positions, prompt-token embedding with its own positions (both streams start at 0), a post-LN transformer whose
text part is bidirectional and whose audio part is causal, and a bias-free head over 1025 tokens (1024 codes + EOS).

What differs from upstream is the cache. The model owns one static buffer per layer, ``[2, slots, heads, max_len,
head_dim]`` (K and V), sized once by :meth:`Text2SemanticModel.setup_caches`. A *slot* is one request's row: it is
filled by :meth:`~Text2SemanticModel.prefill` and then grows by one position per
:meth:`~Text2SemanticModel.decode_step`.
Rows keep their own lengths, so requests at different positions decode together and a new request can join a free
slot between steps (continuous batching). Writes go by index; nothing is concatenated. A decode step attends over a
bucketed prefix of the cache (``kv_len``), with a per-row mask beyond each row's length; its shapes depend only on
(rows, ``kv_len``), and it never syncs with the host, so it can be captured in a CUDA graph per bucket. On CPU the
one-query attention is two batched GEMVs (``baddbmm``/``bmm``, measured faster there than SDPA); on CUDA it is SDPA.
On CPU the step's layer loop runs as TorchScript: Python's per-op cost was a third of an int8 step.

Precision: fp32 on CPU. On GPU the transformer's linear weights and the cache may be fp16/bf16, while the residual
stream, layer-norm statistics, embeddings and the output head (hence the logits) stay fp32: half-precision logits are
known to make GPT-SoVITS stop early. :meth:`Text2SemanticModel.quantize_int8` is the CPU speed path: int8 weights
per output channel (weight-only: activations stay fp32) and a bf16 cache, read by the fused step.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engines.base import BERT_DIM, EOS_TOKEN, ModelFormatError
from engines.gpt_sovits import cpu_step, dynamic_int8, ieee_fp32_on_cuda, int8_packing
from engines.gpt_sovits.checkpoint import GptCheckpoint
from engines.runtime import lazy_zeros

log = logging.getLogger(__name__)

# torch's dynamic-int8 linear params: a TorchScript class, which TorchScript reads from _decode_layers' annotation
# (torch.classes has no type information, so the checker sees Any)
if TYPE_CHECKING:
    _PackedParams = Any
else:
    _PackedParams = torch.classes.quantized.LinearPackedParamsBase

__all__ = ["GptConfig", "Text2SemanticModel", "build_random_gpt", "KV_BUCKET"]

PE_POSITIONS = 4000  # rows of the precomputed sinusoid table (upstream's default size)
KV_BUCKET = 64  # decode attends over the cache prefix rounded up to a multiple of this many positions
LN_EPS = 1e-5  # layer-norm epsilon (torch TransformerEncoderLayer default, as upstream)
PREFILL_SLOW = 2.5  # CPU prefill layers this many times slower per position than the fastest, on average over
PREFILL_SLOW_LAYERS = 4  # this many in a row: one thread after them (one slow layer alone happens in quiet runs)
PREFILL_SOLO = 3  # prefills that then run on one thread from their start before all threads are tried again


@dataclass(frozen=True)
class GptConfig:
    """Architecture of a Text2SemanticDecoder (the ``model`` section of the checkpoint's YAML)."""

    dim: int = 512  # embedding_dim = hidden_dim
    heads: int = 16
    layers: int = 24
    phoneme_vocab: int = 732  # phoneme_vocab_size (v2)
    vocab: int = 1025  # vocab_size: 1024 semantic codes + EOS
    eos: int = EOS_TOKEN

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def ffn(self) -> int:
        return 4 * self.dim  # upstream ignores linear_units and uses 4x hidden

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> GptConfig:
        """Read the checkpoint's YAML dict (with or without the outer ``model`` key)."""
        m = config.get("model", config)
        try:
            cfg = cls(
                dim=int(m["embedding_dim"]),
                heads=int(m["head"]),
                layers=int(m["n_layer"]),
                phoneme_vocab=int(m["phoneme_vocab_size"]),
                vocab=int(m["vocab_size"]),
                eos=int(m.get("EOS", int(m["vocab_size"]) - 1)),
            )
        except KeyError as e:
            raise ModelFormatError(f"GPT config lacks model.{e.args[0]}; the checkpoint is incomplete.") from None
        if cfg.dim % cfg.heads or cfg.eos != cfg.vocab - 1:
            raise ModelFormatError(
                f"GPT config is inconsistent (embedding_dim {cfg.dim}, head {cfg.heads}, EOS {cfg.eos}, "
                f"vocab_size {cfg.vocab}); use an unmodified GPT-SoVITS v2 checkpoint."
            )
        return cfg


def _sine_table(positions: int, dim: int) -> torch.Tensor:
    """Upstream's interleaved sinusoid table ``[positions, dim]`` fp32: even columns sin, odd columns cos."""
    pos = torch.arange(0, positions, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(positions, dim)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class _TokenEmbedding(nn.Module):
    """Holds ``word_embeddings`` under upstream's parameter name."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)


class _Position(nn.Module):
    """Holds the learned positional scale ``alpha`` under upstream's parameter name."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))


class _Attention(nn.Module):
    """Fused QKV projection and output projection (upstream: ``self_attn.in_proj_*``, ``self_attn.out_proj``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)


class Block(nn.Module):
    """One post-LN transformer layer's parameters."""

    def __init__(self, dim: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = _Attention(dim)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)


class _Stack(nn.Module):
    """Holds ``layers`` under upstream's name ``h``."""

    def __init__(self, cfg: GptConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(cfg.dim, cfg.ffn) for _ in range(cfg.layers))

    @property
    def blocks(self) -> list[Block]:
        """``layers`` as the blocks they are (to a type checker a ModuleList holds plain Modules)."""
        return [cast(Block, blk) for blk in self.layers]


class Text2SemanticModel(nn.Module):
    """The v2 GPT with a static, slot-addressed KV cache.

    Parameters
    ----------
    config:
        architecture; :meth:`from_checkpoint` reads it from the file.

    Notes
    -----
    Call :meth:`setup_caches` before :meth:`prefill` / :meth:`decode_step`. Run under ``torch.inference_mode()``.
    """

    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.config = config
        d = config.dim
        self.bert_proj = nn.Linear(BERT_DIM, d)
        self.ar_text_embedding = _TokenEmbedding(config.phoneme_vocab, d)
        self.ar_text_position = _Position()
        self.ar_audio_embedding = _TokenEmbedding(config.vocab, d)
        self.ar_audio_position = _Position()
        self.h: _Stack = _Stack(config)
        self.ar_predict_layer = nn.Linear(d, config.vocab, bias=False)
        self.register_buffer("pe", _sine_table(PE_POSITIONS, d), persistent=False)  # [P, D] fp32
        self.compute_dtype = torch.float32  # dtype of the transformer's linear weights
        self._prefill_fastest = math.inf  # a CPU prefill layer's fastest time per position seen (all threads)
        self._prefill_solo_left = 0  # prefills still to run on one thread (the cores were shared just now)
        self.cache_dtype = torch.float32  # dtype of the KV cache: compute dtype, or bf16 for the int8 CPU path
        self.quantized = False  # int8 linears (quantize_int8)
        self.fused_lib: Any = None  # the fused CPU step's library (use_fused_step), or None: the layer loop
        self._fused: cpu_step.FusedStep | None = None  # the fused step over the current cache, see setup_caches
        self._weights: list[torch.Tensor] = []  # per layer, flat: see _collect_layer_params
        self._packed: list[Any] = []  # per layer, flat: the int8 linears' packed params (quantized only)
        self._view_cache: dict[tuple[int, int, bool], list[torch.Tensor]] = {}  # see _cache_views
        # Static decode state, allocated by setup_caches.
        self.kv: list[torch.Tensor] = []  # per layer [2, slots, H, max_len, hd] compute dtype
        self.text_len = torch.zeros(0, dtype=torch.long)  # [slots] text positions of each slot's prefill
        self._rows = torch.zeros(0, dtype=torch.long)  # [slots] 0..slots-1, to address rows without host work
        self._cols = torch.zeros(0, dtype=torch.long)  # [max_len] 0..max_len-1, for length masks
        self._kv_base = torch.zeros(0, dtype=torch.long)  # [2, H] flat cache offsets, see setup_caches
        self.max_slots: int = 0
        self.max_len: int = 0

    @property
    def device(self) -> torch.device:
        """Where the model's tensors live."""
        return self.pe.device

    @property
    def bert_dim(self) -> int:
        """Width of the BERT features the text stream takes."""
        return self.bert_proj.in_features

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_checkpoint(
        cls, ckpt: GptCheckpoint, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> Text2SemanticModel:
        """Build the model from a loaded checkpoint (strict: every tensor must match by name and shape).

        Parameters
        ----------
        ckpt: from :func:`engines.gpt_sovits.checkpoint.load_gpt_checkpoint`.
        device: ``"cpu"``, ``"cuda:0"``...
        dtype: weight/cache precision of the transformer layers: fp32, or fp16/bf16 (meant for CUDA; on the CPU
            they run too, no faster than fp32, which lets the half-precision numerics be tested anywhere).
        """
        model = cls(GptConfig.from_dict(ckpt.config))
        model.load_upstream_state_dict(ckpt.state_dict)
        ieee_fp32_on_cuda(device)
        return model.to_device(device, dtype)

    def load_upstream_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load upstream-named weights (``model.`` prefix already stripped), cast to fp32, strictly."""
        renamed: dict[str, torch.Tensor] = {}
        for name, t in state_dict.items():
            name = name.replace("self_attn.in_proj_weight", "self_attn.in_proj.weight")
            name = name.replace("self_attn.in_proj_bias", "self_attn.in_proj.bias")
            renamed[name] = t.float()
        own = self.state_dict()
        missing = sorted(set(own) - set(renamed))
        unexpected = sorted(set(renamed) - set(own))
        wrong = [f"{k}: file {tuple(renamed[k].shape)} vs model {tuple(own[k].shape)}"
                 for k in own if k in renamed and renamed[k].shape != own[k].shape]
        if missing or unexpected or wrong:
            raise ModelFormatError(
                "GPT checkpoint does not match its own config "
                f"(missing {missing[:4]}, unexpected {unexpected[:4]}, mismatched {wrong[:4]}); "
                "the file is damaged or not a GPT-SoVITS v2 GPT."
            )
        self.load_state_dict(renamed, strict=True)

    def to_device(self, device: str | torch.device, dtype: torch.dtype = torch.float32) -> Text2SemanticModel:
        """Move to ``device``; transformer linears (and later the cache) in ``dtype``, the rest fp32."""
        device = torch.device(device)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"the GPT runs in fp32, fp16 or bf16, got {dtype}")
        self.to(device=device, dtype=torch.float32)
        for blk in self.h.blocks:
            for lin in (blk.self_attn.in_proj, blk.self_attn.out_proj, blk.linear1, blk.linear2):
                lin.to(dtype=dtype)
        self.compute_dtype = self.cache_dtype = dtype
        self.eval()
        self.requires_grad_(False)
        self.kv, self._fused = [], None
        self.max_slots = self.max_len = 0
        return self

    def quantize_int8(self, weight_only: bool = True, gemm: str = "fbgemm") -> Text2SemanticModel:
        """The CPU speed path: int8 transformer linears and a bf16 KV cache; embeddings, norms and the head stay fp32.

        ``weight_only`` (what the engine plan's ``int8-weight-only`` asks, for the fused CPU step): the weights
        become int8 per output channel with an fp32 scale (symmetric, 127 levels; ``weight_scale`` beside each
        ``weight``) and activations stay fp32, so the weights' rounding is the only one; the layer loop reads them
        dequantised; the prefill's rows but the last run them through ``gemm``'s dynamic int8 GEMM
        (``fbgemm`` or ``onednn``: the engine plan's). Else (``int8-dynamic``, where the fused step cannot run)
        torch's dynamic int8 (fbgemm: activations quantised per step too) runs the TorchScript loop. Greedy tokens
        can differ from fp32 where the top-2 logit gap is small (tests/engines/test_int8_proof.py bounds how much).
        Call :meth:`setup_caches` afterwards.
        """
        if self.pe.device.type != "cpu":
            raise ValueError("int8 quantisation is a CPU path; move the model to CPU first.")
        if weight_only:
            for blk in self.h.blocks:
                for lin in (blk.self_attn.in_proj, blk.self_attn.out_proj, blk.linear1, blk.linear2):
                    w = lin.weight.detach().float()
                    scale = (w.abs().amax(dim=1) / 127).clamp_(min=1e-12)  # [out]
                    lin.weight = nn.Parameter(torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8),
                                              requires_grad=False)
                    lin.register_buffer("weight_scale", scale)
                    lin.prefill_packed = _pack_for_prefill(lin.weight, scale, lin.bias, gemm)
        else:
            self.h = dynamic_int8(self.h)  # (a copy of the stack with its linears swapped: still a _Stack)
        self.quantized = True
        self.cache_dtype = torch.bfloat16
        self.kv, self._fused = [], None  # the next setup_caches allocates the bf16 cache
        self.max_slots = self.max_len = 0
        return self

    @property
    def int8_weights(self) -> bool:
        """int8 weights read by the fused step (``quantize_int8`` where that step runs)."""
        weight: object = getattr(self.h.blocks[0].linear1, "weight")  # on torch's dynamic int8 linears a method
        return isinstance(weight, torch.Tensor) and weight.dtype == torch.int8

    # ------------------------------------------------------------------ cache

    def setup_caches(self, max_slots: int, max_len: int) -> None:
        """Allocate the static KV cache: per layer ``[2, max_slots, heads, max_len, head_dim]``.

        Reallocates only when a larger size is asked for; contents are not preserved then.
        """
        if self.kv and max_slots <= self.max_slots and max_len <= self.max_len:
            return
        max_slots, max_len = max(max_slots, self.max_slots), max(max_len, self.max_len)
        cfg, dev = self.config, self.pe.device
        self.kv = []  # free the old buffers before allocating the new ones
        shape = (2, max_slots, cfg.heads, max_len, cfg.head_dim)
        # on a CPU the pages are committed as positions are written: the cache is sized for engine.max_batch rows of
        # the longest context (805 MB in bf16 at the real size), of which one stream writes a few hundred positions
        self.kv = [lazy_zeros(shape, self.cache_dtype) if dev.type == "cpu"
                   else torch.zeros(shape, dtype=self.cache_dtype, device=dev) for _ in range(cfg.layers)]
        self.text_len = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self._rows = torch.arange(max_slots, device=dev)
        self._cols = torch.arange(max_len, device=dev)
        # Offset of (K|V, head) in a layer's cache flattened to [2 * slots * H * max_len, hd]: [2, H]
        kv_id, head = torch.arange(2, device=dev)[:, None], torch.arange(cfg.heads, device=dev)[None, :]
        self._kv_base = (kv_id * (max_slots * cfg.heads) + head) * max_len
        if max_len > self.pe.shape[0]:
            self.pe = _sine_table(max_len, cfg.dim).to(dev)
        self.max_slots, self.max_len = max_slots, max_len
        self._view_cache.clear()
        self._choose_step()
        log.debug("GPT KV cache: %d slots x %d positions (%s, %s step)", max_slots, max_len, self.cache_dtype,
                  "fused" if self._fused is not None else "TorchScript")

    def use_fused_step(self, lib: Any) -> Text2SemanticModel:
        """Decode with the fused CPU step built as ``lib`` (:func:`cpu_step.load_library`), or with the layer loop
        (None). The engine plan decides which; the model never loads the library itself."""
        self.fused_lib = lib
        if self.kv:
            self._choose_step()
        return self

    def _choose_step(self) -> None:
        """The fused step over the current cache when the model has one, else the layer loop's parameter lists."""
        self._fused = self._fused_step()
        self._weights, self._packed = self._collect_layer_params() if self._fused is None else ([], [])

    def __deepcopy__(self, memo: dict[int, Any]) -> Text2SemanticModel:
        """A copy with its own cache; its fused step is made anew over that cache (C pointers are not copied)."""
        fused, self._fused = self._fused, None
        memo[id(self.fused_lib)] = self.fused_lib  # the loaded library is shared, never copied
        try:
            state = copy.deepcopy(self.__dict__, memo)
        finally:
            self._fused = fused
        new = type(self).__new__(type(self))
        new.__dict__.update(state)
        new._fused = new._fused_step() if fused is not None and new.kv else None
        return new

    def _fused_step(self, lib: Any = None) -> cpu_step.FusedStep | None:
        """The fused CPU step over the current cache, with :attr:`fused_lib` (``lib``: another build of it, for
        tests); None where the model has none. It reads fp32 or weight-only int8 weights on a CPU only."""
        lib = lib or self.fused_lib
        if lib is None:
            return None
        if (self.pe.device.type != "cpu" or self.compute_dtype != torch.float32
                or (self.quantized and not self.int8_weights)):
            raise ValueError("the fused CPU step reads fp32 or weight-only int8 weights on a CPU; the engine plan "
                             "gives it no other model")
        layers: list[cpu_step.LayerParams] = []
        for blk in self.h.blocks:
            lins = (blk.self_attn.in_proj, blk.self_attn.out_proj, blk.linear1, blk.linear2)
            layers.append(([(lin.weight.detach(), getattr(lin, "weight_scale", None), lin.bias.detach())
                            for lin in lins],
                           [(blk.norm1.weight.detach(), blk.norm1.bias.detach()),
                            (blk.norm2.weight.detach(), blk.norm2.bias.detach())]))
        return cpu_step.FusedStep(lib, layers, self.kv, self.ar_predict_layer.weight.detach(), dim=self.config.dim,
                                  heads=self.config.heads, ffn=self.config.ffn, eps=LN_EPS)

    def _collect_layer_params(self) -> tuple[list[torch.Tensor], list[Any]]:
        """The layers' parameters as :func:`_decode_layers` reads them (flat lists, layer after layer).

        Tensors: per layer the four linears' (weight, bias) then both norms' (weight, bias), 12 per layer; with
        torch's dynamic int8 only the norms (4 per layer), and the four linears' packed params go in the second list.
        The fused step's int8 weights are given dequantised (fp32 copies: the reference loop its tests compare with).
        """
        weights: list[torch.Tensor] = []
        packed: list[Any] = []
        for blk in self.h.blocks:
            lins = (blk.self_attn.in_proj, blk.self_attn.out_proj, blk.linear1, blk.linear2)
            if self.quantized and not self.int8_weights:
                packed.extend(_packed_params(lin) for lin in lins)
            elif self.quantized:
                weights.extend(t for lin in lins for t in (lin.weight.float() * _weight_scale(lin)[:, None], lin.bias))
            else:
                weights.extend(t for lin in lins for t in (lin.weight, lin.bias))
            weights.extend((blk.norm1.weight, blk.norm1.bias, blk.norm2.weight, blk.norm2.bias))
        return weights, packed

    # ------------------------------------------------------------------ embeddings

    def embed_text(self, phones: torch.Tensor, bert: torch.Tensor) -> torch.Tensor:
        """Text stream input: ``[B, Tx]`` phone ids + ``[B, 1024, Tx]`` BERT -> ``[B, Tx, D]`` fp32."""
        x = self.ar_text_embedding.word_embeddings(phones) + self.bert_proj(bert.float().transpose(1, 2))
        return x + self.ar_text_position.alpha * self.pe[: x.shape[1]]

    def embed_prompt(self, tokens: torch.Tensor) -> torch.Tensor:
        """Audio stream input for the prompt: ``[B, Tp]`` token ids -> ``[B, Tp, D]`` fp32 (positions from 0)."""
        y = self.ar_audio_embedding.word_embeddings(tokens)
        return y + self.ar_audio_position.alpha * self.pe[: y.shape[1]]

    # ------------------------------------------------------------------ forward passes

    def _norm(self, x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
        """Layer norm with fp32 statistics."""
        return F.layer_norm(x.float(), ln.normalized_shape, ln.weight, ln.bias, ln.eps)

    def _linear(self, lin: nn.Linear | nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``lin(x)`` for the prefill's ``x [1, S, in]``. The fused step's int8 weights: fbgemm's dynamic int8 GEMM
        for the rows (activations rounded per call), except the last row, weight-only as the decode steps compute:
        it alone makes the first token's logits, which dynamic int8 moved by up to 0.2 on the golden data; so made
        (by the fused step's own product), the logits stay within 0.107 of upstream's (0.088 with every row weight-only; tests/engines/test_int8_proof.py
        bounds them at 0.15). It halves the prefill's time (see FINDINGS.md#prefill-int8-gemm)."""
        packed = getattr(lin, "prefill_packed", None)
        lib = self.fused_lib if packed is not None else None
        if packed is None or lib is None:
            return Text2SemanticModel._weight_only(lin, x)
        # the last row by the step's own int8 product (reads the int8 weight once; converting it to fp32 for F.linear
        # cost ~30 ms of a 0.3 s prefill, 7 ms for one 512x2048 weight)
        last = cpu_step.linear(lib, cast(torch.Tensor, lin.weight), _weight_scale(lin), cast(torch.Tensor, lin.bias),
                               x[:, -1])  # [1, out]
        if x.shape[1] == 1:  # the last layer's one row
            return last[None]
        y = torch.ops.quantized.linear_dynamic(x, packed, True)
        y[:, -1] = last
        return y

    @staticmethod
    def _weight_only(lin: nn.Linear | nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``lin(x)``, also for the fused step's int8 weights (scaled after the product: no fp32 weight copy)."""
        weight = lin.weight
        if isinstance(weight, torch.Tensor) and weight.dtype == torch.int8:
            return torch.addcmul(cast(torch.Tensor, lin.bias), F.linear(x, weight.to(x.dtype)), _weight_scale(lin))
        return lin(x)

    def _ffn(self, blk: Block, x: torch.Tensor) -> torch.Tensor:
        """ReLU MLP in the compute dtype; ``x`` is the fp32 residual stream."""
        return self._linear(blk.linear2, F.relu(self._linear(blk.linear1, x.to(self.compute_dtype))))

    def prefill(self, slot: int, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """Run the whole input of one request and write its K/V into cache row ``slot``.

        Parameters
        ----------
        slot: cache row to fill (``0 <= slot < max_slots``).
        phones: ``[Tx]`` int64 phone ids (prompt phones + target phones).
        bert: ``[1024, Tx]`` float BERT features.
        prompt: ``[Tp]`` int64 prompt semantic tokens (may be empty: reference-free).

        Returns
        -------
        ``[vocab]`` fp32 logits for the first generated token. The row's length is now ``Tx + Tp``.
        """
        tx, tp = int(phones.shape[0]), int(prompt.shape[0])
        s = tx + tp
        if not self.kv:
            raise RuntimeError("setup_caches() must be called before prefill()")
        if s > self.max_len or not 0 <= slot < self.max_slots:
            raise ValueError(
                f"prefill of {s} positions into slot {slot} exceeds the cache {self.max_slots}x{self.max_len}"
            )
        dev = self.pe.device
        x = self.embed_text(phones.to(dev)[None], bert.to(dev)[None])  # [1, Tx, D]
        if tp:
            x = torch.cat([x, self.embed_prompt(prompt.to(dev)[None])], dim=1)  # [1, S, D]
        # True = may attend: every row sees all text; audio rows also see audio causally; text never sees audio.
        allowed = torch.ones(s, s, dtype=torch.bool, device=dev).tril_()
        allowed[:, :tx] = True
        # on a CPU the text rows and the audio rows apart, the audio rows' mask made once (see _prefill_attention)
        split = None if dev.type != "cpu" else _prefill_split(allowed, tx, self.compute_dtype)
        h = x  # [1, S, D] fp32 residual stream
        n_layers = len(self.h.layers)
        threads = torch.get_num_threads()
        recent: list[float] = []  # this prefill's last layers against the fastest
        if dev.type == "cpu" and self._prefill_solo_left > 0:  # the cores were shared a moment ago: one thread
            self._prefill_solo_left -= 1
            torch.set_num_threads(1)
        try:
            for i, blk in enumerate(self.h.blocks):
                t0 = time.perf_counter()
                h = self._prefill_layer(i, blk, h, slot, s, allowed, split, last=i == n_layers - 1)
                if dev.type == "cpu" and i < n_layers - 1 and torch.get_num_threads() > 1:
                    self._watch_prefill_layer((time.perf_counter() - t0) / s, recent)
        finally:
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
        self.text_len[slot] = tx
        return self.ar_predict_layer(h[0, -1])

    def _watch_prefill_layer(self, per_position_s: float, recent: list[float]) -> None:
        """One thread for the rest of a CPU prefill once :data:`PREFILL_SLOW_LAYERS` layers in a row ran on average
        :data:`PREFILL_SLOW` times slower per position than the fastest seen: another process has a core, and
        torch's threads then wait for each other at every op, slower than one thread alone; a lower threshold sent
        quiet prefills solo too, after the vocoder's spinning threads (see FINDINGS.md#prefill-solo-thread). The
        next :data:`PREFILL_SOLO` prefills run on one thread from their start,
        then one tries all threads again. ``recent``: this prefill's last layers against the fastest (appended to)."""
        self._prefill_fastest = min(self._prefill_fastest, per_position_s)
        recent.append(per_position_s / self._prefill_fastest)
        if len(recent) > PREFILL_SLOW_LAYERS:
            recent.pop(0)
        if len(recent) == PREFILL_SLOW_LAYERS and sum(recent) > PREFILL_SLOW * PREFILL_SLOW_LAYERS:
            torch.set_num_threads(1)
            self._prefill_solo_left = PREFILL_SOLO

    def _prefill_layer(self, i: int, blk: Block, h: torch.Tensor, slot: int, s: int, allowed: torch.Tensor,
                       split: tuple[int, torch.Tensor | None] | None, *, last: bool) -> torch.Tensor:
        """Layer ``i`` of the prefill: writes its K/V into cache row ``slot``; the last layer's output is its last
        position's only (it alone feeds the logits)."""
        cfg = self.config
        qkv = self._linear(blk.self_attn.in_proj, h.to(self.compute_dtype))  # [1, S, 3D]
        q, k, v = qkv.view(s, 3, cfg.heads, cfg.head_dim).permute(1, 2, 0, 3).unbind(0)  # [H, S, hd] each
        self.kv[i][0, slot, :, :s] = k
        self.kv[i][1, slot, :, :s] = v
        mask = allowed
        if last:  # only the last position's output feeds the logits
            q, h, mask = q[:, -1:], h[:, -1:], allowed[-1:]
        a = _prefill_attention(q, k, v, mask, split)[None]  # [1, H, s', hd]
        a = self._linear(blk.self_attn.out_proj, a.transpose(1, 2).reshape(1, -1, cfg.dim))
        h = self._norm(h + a.float(), blk.norm1)
        return self._norm(h + self._ffn(blk, h).float(), blk.norm2)

    def decode_step(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None = None, kv_len: int = 0
    ) -> torch.Tensor:
        """One token for each of ``B`` rows; shapes depend only on (B, kv_len), no host sync (CUDA-graph safe).

        Parameters
        ----------
        tokens: ``[B]`` int64, the previous token of each row.
        positions: ``[B]`` int64, each row's current length = the cache index this token is written to.
        slots: ``[B]`` int64 cache rows; ``None`` means rows ``0..B-1`` (fast: the cache is read as a view).
        kv_len: attend over cache positions ``[0, kv_len)``; must exceed every ``positions`` entry.
            Bucket it (see :data:`KV_BUCKET`); ``0`` means the full cache.

        Returns
        -------
        ``[B, vocab]`` fp32 logits.
        """
        cfg = self.config
        b, heads = tokens.shape[0], cfg.heads
        kv_len = kv_len or self.max_len
        rows = self._rows[:b] if slots is None else slots
        pe_pos = (positions - self.text_len[rows]).clamp_(min=0)  # token index in the audio stream
        h = self.ar_audio_embedding.word_embeddings(tokens) + self.ar_audio_position.alpha * self.pe[pe_pos]  # [B, D]
        if self._fused is not None:  # every layer and the head in one C call per group of rows
            n = cpu_step.MAX_ROWS
            return torch.cat([self._fused(h[r: r + n], rows[r: r + n], positions[r: r + n]) for r in range(0, b, n)])
        # [B, 1, 1, kv_len] additive mask: 0 up to each row's length, -inf beyond (cheaper than a bool mask)
        mask = torch.zeros(b, 1, 1, kv_len, dtype=self.cache_dtype, device=tokens.device).masked_fill_(
            (self._cols[:kv_len] > positions[:, None])[:, None, None, :], float("-inf"))
        # Flat cache row of (K|V, row, head) at each row's position, shared by all layers: [B * 2 * H]
        write_at = (self._kv_base[None] + (rows * (heads * self.max_len) + positions)[:, None, None]).flatten()
        # CPU fp32: batched GEMV attention (fewer passes over the cache than SDPA there). CUDA, and the bf16 cache of
        # the int8 CPU path: SDPA (CPU bf16 bmm is slow; CPU bf16 SDPA accumulates in fp32 and beats fp32 bmm).
        bmm = self.pe.device.type == "cpu" and self.cache_dtype == torch.float32
        if bmm:
            mask = mask.expand(b, heads, 1, kv_len).reshape(b * heads, 1, kv_len)
        views = self._cache_views(b, kv_len, bmm) if slots is None else []
        h = _layers_runner(self.pe.device)(h, write_at, mask, self.kv, views, self._weights, self._packed, slots,
                                           kv_len, heads, bmm, LN_EPS)
        return self.ar_predict_layer(h)

    def _cache_views(self, b: int, kv_len: int, bmm: bool) -> list[torch.Tensor]:
        """Per layer: the cache as ``[-1, hd]`` rows for writes, then K and V of rows ``0..b-1``, flattened into one
        list; views made once per shape (a few host ops per layer saved on every later step)."""
        key = (b, kv_len, bmm)
        if key not in self._view_cache:
            hd = self.config.head_dim
            self._view_cache[key] = [t for c in self.kv
                                     for t in (c.view(-1, hd), *_kv_layout(c[0, :b], c[1, :b], kv_len, bmm))]
        return self._view_cache[key]


def _prefill_split(allowed: torch.Tensor, tx: int, dtype: torch.dtype) -> tuple[int, torch.Tensor | None]:
    """:func:`_prefill_attention`'s ``split`` for the prefill mask ``allowed [S, S]`` of ``tx`` text positions: ``tx``
    and the audio rows of ``allowed`` as an additive bias ``[S - tx, S]`` of zeros and -inf (None without audio rows)."""
    if allowed.shape[0] == tx:
        return tx, None
    return tx, torch.zeros(allowed.shape[0] - tx, allowed.shape[1], dtype=dtype).masked_fill_(
        ~allowed[tx:], float("-inf"))


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                       split: tuple[int, torch.Tensor | None] | None = None) -> torch.Tensor:
    """``[H, s', hd]`` attention of the prefill (``allowed [s', S]`` bool: ``s'`` is S, or 1 for the last position).

    On a CPU (``split``: the text length ``tx`` and the audio rows' mask ``[S - tx, S]`` as an additive bias of
    zeros and -inf, None without audio rows) the text rows, which see the text alone, and the audio rows, which see
    the text and the audio before them, run apart through torch's fused CPU attention: faster than two batched
    products around a softmax over the whole [S, S] (its scores made anew each layer) and than SDPA over the whole
    [S, S] with its mask (see FINDINGS.md#prefill-attention)."""
    if q.device.type != "cpu" or split is None:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=allowed)[0]
    if q.shape[1] < k.shape[1]:  # the last position (text or audio) sees every position
        return F.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    tx, audio = split
    text = F.scaled_dot_product_attention(q[None, :, :tx], k[None, :, :tx], v[None, :, :tx])[0]
    if audio is None:
        return text
    rest = F.scaled_dot_product_attention(q[None, :, tx:], k[None], v[None], attn_mask=audio)[0]
    return torch.cat([text, rest], dim=1)


def _pack_for_prefill(weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, library: str = "fbgemm") -> Any:
    """The int8 weight (per output channel) packed for ``library``'s dynamic int8 GEMM (``fbgemm`` or ``onednn``),
    which the prefill runs: its ~200 rows make the prefill compute-bound, and int8 products run about twice fp32's
    rate on AVX2 (see FINDINGS.md#prefill-int8-gemm). ``None`` where torch lacks it (the prefill then runs
    weight-only)."""
    if library not in torch.backends.quantized.supported_engines:
        return None
    with warnings.catch_warnings():  # torch marks its quantized tensors deprecated (fbgemm's GEMM is what we use)
        warnings.simplefilter("ignore")
        # (torch's only call that wraps existing int8 values as a per-channel quantized tensor is private)
        q = torch._make_per_channel_quantized_tensor(  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]
            weight, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
        with int8_packing(library):
            return torch.ops.quantized.linear_prepack(q, bias)


def _kv_layout(k: torch.Tensor, v: torch.Tensor, kv_len: int, bmm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, H, max_len, hd]`` K, V -> the attention kernel's layout over ``[0, kv_len)``, as views."""
    k, v = k[:, :, :kv_len], v[:, :, :kv_len]  # [B, H, kv_len, hd]
    if not bmm:
        return k, v
    bh, hd = k.shape[0] * k.shape[1], k.shape[3]  # .view, never .reshape: a cached view must not be a copy
    return k.view(bh, kv_len, hd).transpose(1, 2), v.view(bh, kv_len, hd)  # [B*H, hd, kv_len], [B*H, kv_len, hd]


def _weight_scale(lin: nn.Module) -> torch.Tensor:
    """The ``[out]`` fp32 scale of a linear with the fused step's int8 weights (a buffer quantize_int8 adds)."""
    return cast(torch.Tensor, lin.weight_scale)


def _packed_params(lin: nn.Module) -> _PackedParams:
    """A torch dynamic-int8 linear's packed weight and bias (kept in a private wrapper module)."""
    return getattr(lin, "_packed_params")._packed_params


def _decode_layers(
    h: torch.Tensor, write_at: torch.Tensor, mask: torch.Tensor, kv: list[torch.Tensor], views: list[torch.Tensor],
    weights: list[torch.Tensor], packed: list[_PackedParams],
    slots: torch.Tensor | None, kv_len: int, heads: int, bmm: bool, eps: float,
) -> torch.Tensor:
    """The transformer layers of one decode step: ``[B, D]`` fp32 residual stream in and out.

    Written in the TorchScript subset: on CPU it runs scripted (:func:`_layers_runner`), which removes most of the
    per-op Python cost (see FINDINGS.md#torchscript-decode-layers); on CUDA it runs as Python and the
    step is captured in a CUDA graph instead.

    ``kv`` is each layer's cache; ``views`` the flat per-layer (write rows, K, V) of :meth:`Text2SemanticModel.
    _cache_views` for rows ``0..B-1``, or empty when ``slots`` names the rows (K, V then gathered after the write).
    ``mask`` is additive, in the cache dtype; ``weights``/``packed`` as :meth:`Text2SemanticModel.
    _collect_layer_params`. ``bmm``: batched-GEMV attention (CPU fp32 cache), else SDPA. ``eps``: layer-norm epsilon.
    """
    b, d = h.shape[0], h.shape[1]
    hd = d // heads
    bh = b * heads
    scale = float(hd) ** -0.5
    quantized = len(packed) > 0
    per = 4 if quantized else 12  # tensors per layer in ``weights``
    for i in range(len(kv)):
        w = i * per
        if quantized:
            qkv = torch.ops.quantized.linear_dynamic(h, packed[4 * i], True)
        else:
            qkv = F.linear(h.to(weights[w].dtype), weights[w], weights[w + 1])
        qkv = qkv.view(b, 3, heads, hd).to(mask.dtype)
        new_kv = qkv[:, 1:].reshape(-1, hd)  # K and V of the new token
        if slots is None:
            views[3 * i].index_copy_(0, write_at, new_kv)
            k, v = views[3 * i + 1], views[3 * i + 2]
        else:  # gathered rows: a copy, so taken after the write
            kv[i].view(-1, hd).index_copy_(0, write_at, new_kv)
            k, v = _kv_layout(kv[i][0].index_select(0, slots), kv[i][1].index_select(0, slots), kv_len, bmm)
        if bmm:
            scores = torch.baddbmm(mask, qkv[:, 0].reshape(bh, 1, hd), k, alpha=scale)  # [B*H, 1, kv_len]
            a = torch.bmm(torch.softmax(scores, dim=-1), v)  # [B*H, 1, hd]
        else:
            a = F.scaled_dot_product_attention(qkv[:, 0, :, None], k, v, attn_mask=mask)  # [B, H, 1, hd]
        g1, b1, g2, b2 = weights[w + per - 4], weights[w + per - 3], weights[w + per - 2], weights[w + per - 1]
        if quantized:  # int8 weights, fp32 activations in and out
            a = torch.ops.quantized.linear_dynamic(a.reshape(b, d).float(), packed[4 * i + 1], True)
            h = F.layer_norm(a.add_(h), [d], g1, b1, eps)
            f = torch.ops.quantized.linear_relu_dynamic(h, packed[4 * i + 2], True)
            f = torch.ops.quantized.linear_dynamic(f, packed[4 * i + 3], True)
        else:
            a = F.linear(a.reshape(b, d).to(weights[w + 2].dtype), weights[w + 2], weights[w + 3])
            h = F.layer_norm(a.float().add_(h), [d], g1, b1, eps)
            f = F.relu(F.linear(h.to(weights[w + 4].dtype), weights[w + 4], weights[w + 5]))
            f = F.linear(f, weights[w + 6], weights[w + 7]).float()
        h = F.layer_norm(f.add_(h), [d], g2, b2, eps)
    return h


@functools.lru_cache(maxsize=None)
def _scripted_layers() -> Any:
    """:func:`_decode_layers` compiled by TorchScript (once per process), or the Python function itself where
    TorchScript cannot compile it (it is deprecated: a torch without it still decodes, just slower)."""
    with warnings.catch_warnings():  # torch 2.13 marks TorchScript deprecated; it is still the fastest CPU path
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return torch.jit.script(_decode_layers)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]  # untyped overloads
        except Exception as e:  # noqa: BLE001 - any failure of the compiler leaves the Python loop, which works
            log.warning("TorchScript could not compile the GPT layer loop (%s: %s); it runs as Python, up to 1.5x "
                        "slower per step on a CPU", type(e).__name__, e)
            return _decode_layers


def _layers_runner(device: torch.device) -> Any:
    """What runs :func:`_decode_layers` on ``device``: TorchScript on CPU, Python on CUDA (graph-captured)."""
    return _scripted_layers() if device.type == "cpu" else _decode_layers


def build_random_gpt(
    size: str = "real", seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Text2SemanticModel:
    """A GPT with seeded random weights, for benchmarks and tests, at one of the random model set's sizes
    (:data:`engines.gpt_sovits.tiny.GPT_SIZES`): ``"real"`` is the released v2 architecture (512/16/24),
    ``"tiny"`` the small one ``models make-tiny`` writes. Vocabularies are the real ones (732 phones, 1025 tokens).
    """
    from engines.gpt_sovits.tiny import GPT_SIZES  # the one table of the random sizes (imported late: no cycle)

    if size not in GPT_SIZES:
        raise ValueError(f"size must be one of {sorted(GPT_SIZES)}, got {size!r}")
    dim, heads, layers = GPT_SIZES[size]
    gen = torch.Generator().manual_seed(seed)
    model = Text2SemanticModel(GptConfig(dim=dim, heads=heads, layers=layers))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.fill_(1.0)
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen) if name.endswith("weight")
                        else 0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.ndim > 1 else model.config.dim
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
    return model.to_device(device, dtype)

