"""ONNX export of GPT-SoVITS v2/v2Pro/v2ProPlus for the ONNX Runtime and TensorRT engines, graph checks, and
``engines build``.

Five graphs, all fp32, opset 17, dynamic over batch and lengths, with no random op, no STFT and no Python-side
control flow baked in (the faults of upstream's own export, reference section 9.1):

==================  =====================================================  ===========================================
graph               inputs                                                 outputs
==================  =====================================================  ===========================================
gpt_prefill         phones [1,Tx] i64, bert [1,1024,Tx], prompt [1,Tp] i64  logits [1,V], keys [L,H,hd,S], values [L,H,S,hd]
gpt_step            tokens [B] i64, audio_pos [B] i64, kv_bias [B,T],      logits [B,V], new_k [L,B,H,hd], new_v [L,B,H,hd]
                    past_k_<l> [B,H,hd,T], past_v_<l> [B,H,T,hd] per layer
sovits_decode       codes [1,1,Ts] i64, text [1,Tt] i64, ge [1,gin,1],     wav [1,1,frames*640]
                    noise [1,C,frames] (eps * noise_scale; zeros: none)
ref_style           spec [B,1025,Tr] (linear spectrogram);                ge [B,gin,1]
                    v2Pro/v2ProPlus also sv [B,sv_dim] (SV features)
extract_latent      ssl [B,768,T50] (HuBERT features)                      codes [1,B,T50//2] i64
==================  =====================================================  ===========================================

The step graph reads a fixed-capacity KV cache the *caller* owns (one input per layer, so each is a contiguous
buffer bound without a copy), masks unused positions with the additive ``kv_bias`` (0 = attend, -inf = not), and
returns only the new token's K and V; the caller writes them into its cache. The new token attends to itself through
a separate score, so the graph never concatenates the cache. K is stored transposed (``[hd, T]``) so both attention
products are plain MatMuls. Sampling stays outside the graphs, in :mod:`engines.gpt_sovits.sampling`, so upstream's
exact rules hold on every backend. ``noise``'s frame count sets the output length, so speed needs no graph input:
at speed 1 it is ``2 Ts`` and the linear resize is the identity. For v2Pro/v2ProPlus, ``ge`` is the fused style
(``PReLU(ref_enc + sv_emb(sv))``, what flow and vocoder read) and ``sovits_decode`` feeds the MRTE ``ge_to512(ge)``
itself; the SV features come from the torch SV model, outside the graphs (its filter banks are an FFT).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Generator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.base import BERT_DIM, EngineError, ModelPaths
from engines.gpt_sovits import sovits_modules
from engines.gpt_sovits.checkpoint import (file_fingerprint, load_gpt_checkpoint, load_sovits_checkpoint, model_id,
                                          require_model_files)
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.sovits import SSL_DIM, SoVITSDecoder

log = logging.getLogger(__name__)

__all__ = ["export_onnx", "check_graphs", "ensure_onnx", "GRAPHS", "TRT_SUPPORTED_OPS"]

DEFAULT_OPSET = 17  # LayerNormalization is native from 17; TensorRT 10 parses opsets 9..20
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1  # bump when the graphs' signatures change, so old exports are redone
GRAPHS = ("gpt_prefill", "gpt_step", "sovits_decode", "ref_style", "extract_latent")
INT8_STEP = "gpt_step.int8"  # ORT dynamic-int8 variant of the step graph (CPU only, opt-in)

# Operators TensorRT 10.0's ONNX parser supports ("Y" rows of onnx-tensorrt docs/operators.md, TensorRT 10.0).
TRT_SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast CastLike Ceil Celu
Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DeformConv DepthToSpace DequantizeLinear Div
Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements GatherND Gelu Gemm
GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization GRU HardSigmoid
HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LayerNormalization LeakyRelu Less
LessOrEqual Log LogSoftmax Loop LRN LSTM LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min
Mish Mod Mul Neg NonMaxSuppression NonZero Not OneHot Or Pad ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal
RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RNN RoiAlign
Round ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze
Upsample Where Xor
""".split())
# Ops that must never be in our graphs even though TensorRT parses them (randomness belongs to the caller).
FORBIDDEN_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "STFT", "DFT"})


# --------------------------------------------------------------------------------------------------- GPT graphs


class _GptPrefill(nn.Module):
    """One request's whole input -> first logits and every layer's K (transposed) and V."""

    def __init__(self, gpt: Text2SemanticModel) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, phones: Tensor, bert: Tensor, prompt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        g, cfg = self.gpt, self.gpt.config
        h = torch.cat([g.embed_text(phones, bert), g.embed_prompt(prompt)], dim=1)  # [1, S, D]
        tx = phones.shape[1]
        idx = torch.arange(h.shape[1], device=h.device)
        # text columns are visible to every row; audio columns causally; text rows never see audio
        allowed = (idx[None, :] <= idx[:, None]) | (idx[None, :] < tx)  # [S, S]
        bias = torch.where(allowed, torch.zeros((), device=h.device), torch.full((), -math.inf, device=h.device))
        scale = 1.0 / math.sqrt(cfg.head_dim)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        n_layers = len(g.h.layers)
        for i, blk in enumerate(g.h.blocks):
            qkv = blk.self_attn.in_proj(h).reshape(-1, 3, cfg.heads, cfg.head_dim).permute(1, 2, 0, 3)  # [3,H,S,hd]
            q, k, v = qkv[0], qkv[1], qkv[2]
            kt = k.transpose(1, 2)  # [H, hd, S]
            keys.append(kt)
            values.append(v)
            b = bias
            if i == n_layers - 1:  # only the last position feeds the logits
                q, h, b = q[:, -1:], h[:, -1:], bias[-1:]
            p = torch.softmax(torch.matmul(q * scale, kt) + b, dim=-1)  # [H, s', S]
            a = torch.matmul(p, v).transpose(0, 1).reshape(1, -1, cfg.dim)  # [1, s', D]
            h = g._norm(h + blk.self_attn.out_proj(a), blk.norm1)  # pyright: ignore[reportPrivateUsage]  # the model's own layer maths, traced
            h = g._norm(h + g._ffn(blk, h), blk.norm2)  # pyright: ignore[reportPrivateUsage]  # the model's own layer maths, traced
        logits = g.ar_predict_layer(h[:, -1])  # [1, V]
        return logits, torch.stack(keys), torch.stack(values)


class _GptStep(nn.Module):
    """One token per row against a caller-owned cache; returns logits and the new K/V (not the cache)."""

    def __init__(self, gpt: Text2SemanticModel) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens: Tensor, audio_pos: Tensor, kv_bias: Tensor, *past: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        g, cfg = self.gpt, self.gpt.config
        emb = g.ar_audio_embedding.word_embeddings(tokens) + g.ar_audio_position.alpha * g.pe[audio_pos]  # [B, D]
        h = emb.unsqueeze(1)  # [B, 1, D]: 3-D keeps the linears as MatMul (quantisable, TensorRT-friendly)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        bias = kv_bias.unsqueeze(1).unsqueeze(2)  # [B, 1, 1, T]
        new_k: list[Tensor] = []
        new_v: list[Tensor] = []
        for i, blk in enumerate(g.h.blocks):
            past_k, past_v = past[2 * i], past[2 * i + 1]  # [B, H, hd, T], [B, H, T, hd]
            qkv = blk.self_attn.in_proj(h).reshape(-1, 3, cfg.heads, cfg.head_dim)  # [B, 3, H, hd]
            q, k, v = qkv[:, 0] * scale, qkv[:, 1], qkv[:, 2]  # [B, H, hd]
            new_k.append(k)
            new_v.append(v)
            s_cache = torch.matmul(q.unsqueeze(2), past_k) + bias  # [B, H, 1, T]
            s_self = (q * k).sum(-1, keepdim=True).unsqueeze(-1)  # [B, H, 1, 1]
            p = torch.softmax(torch.cat([s_cache, s_self], dim=-1), dim=-1)  # [B, H, 1, T+1]
            a = torch.matmul(p[..., :-1], past_v) + p[..., -1:] * v.unsqueeze(2)  # [B, H, 1, hd]
            a = a.reshape(-1, 1, cfg.dim)
            h = g._norm(h + blk.self_attn.out_proj(a), blk.norm1)  # pyright: ignore[reportPrivateUsage]  # the model's own layer maths, traced
            h = g._norm(h + g._ffn(blk, h), blk.norm2)  # pyright: ignore[reportPrivateUsage]  # the model's own layer maths, traced
        logits = g.ar_predict_layer(h).reshape(-1, cfg.vocab)  # [B, V] (a reshape: squeeze exports as an If)
        return logits, torch.stack(new_k), torch.stack(new_v)


# ------------------------------------------------------------------------------------------------ SoVITS graphs


class _SovitsDecode(nn.Module):
    """Tokens + phones + style + prior noise -> waveform; the noise tensor's length sets the frame count."""

    def __init__(self, sovits: SoVITSDecoder) -> None:
        super().__init__()
        self.sovits = sovits

    def forward(self, codes: Tensor, text: Tensor, ge: Tensor, noise: Tensor) -> Tensor:
        s = self.sovits
        enc = s.enc_p
        y = s.dequantize(codes)  # [1, 768, Ts]
        y = y.unsqueeze(-1).expand(-1, -1, -1, 2).reshape(y.shape[0], y.shape[1], -1)  # 2x nearest: 25 -> 50 Hz
        y = enc.encoder_ssl(enc.ssl_proj(y))
        t = enc.encoder_text(enc.text_embedding(text).transpose(1, 2))
        y = enc.encoder2(enc.mrte(y, t, s.text_style(ge)))  # v2Pro: the MRTE gets ge_to512(ge)
        # speed: resample the encoder output to the caller's frame count (identity at speed 1)
        y = F.interpolate(y, size=noise.shape[-1], mode="linear")
        m_p, logs_p = torch.split(enc.proj(y), enc.out_channels, dim=1)
        z_p = m_p + noise * torch.exp(logs_p)
        return s.vocode(s.flow_reverse(z_p, ge), ge)


class _RefStyle(nn.Module):
    """Linear spectrogram (+ v2Pro: SV features ``sv [B, sv_dim]``) -> style vector ``ge``."""

    def __init__(self, sovits: SoVITSDecoder) -> None:
        super().__init__()
        self.sovits = sovits

    def forward(self, spec: Tensor, sv: Tensor | None = None) -> Tensor:
        return self.sovits.ref_style(spec, sv)


class _ExtractLatent(nn.Module):
    """HuBERT features -> semantic codes."""

    def __init__(self, sovits: SoVITSDecoder) -> None:
        super().__init__()
        self.sovits = sovits

    def forward(self, ssl: Tensor) -> Tensor:
        return self.sovits.extract_latent(ssl)


def _band_indices_traced(t: Any, w: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Uncached twin of ``sovits_modules._band_indices``: computed in-graph from the traced length."""
    i = torch.arange(t, device=device).unsqueeze(1)
    j = torch.arange(t, device=device).unsqueeze(0)
    off = j - i + w
    to_full = torch.where((off >= 0) & (off <= 2 * w), off, torch.full_like(off, 2 * w + 1))
    to_band = i + torch.arange(2 * w + 1, device=device).unsqueeze(0)
    return to_full, to_band


def _channel_norm_static(self: sovits_modules.ChannelLayerNorm, x: Tensor) -> Tensor:
    """``ChannelLayerNorm.forward`` with the normalised size taken from the weights (a constant when traced)."""
    c = int(self.gamma.shape[0])
    y = F.layer_norm(x.transpose(1, 2).float(), (c,), self.gamma.float(), self.beta.float(), sovits_modules.LN_EPS)
    return y.to(x.dtype).transpose(1, 2)


@contextlib.contextmanager
def _traceable_sovits() -> Generator[None, None, None]:
    """During export, make two SoVITS helpers trace with dynamic time axes (same maths).

    The relative attention caches its gather indices per Python length, so a trace would bake one length's
    indices in as constants; the channel layer norm reads its size from the input's shape, which the exporter
    cannot turn into LayerNormalization's static attribute.
    """
    # (the patch reaches a private helper of the module it patches)
    band, norm = sovits_modules._band_indices, sovits_modules.ChannelLayerNorm.forward  # pyright: ignore[reportPrivateUsage]
    sovits_modules._band_indices = _band_indices_traced  # type: ignore[assignment]
    sovits_modules.ChannelLayerNorm.forward = _channel_norm_static  # type: ignore[method-assign]
    try:
        yield
    finally:
        sovits_modules._band_indices = band  # type: ignore[assignment]
        sovits_modules.ChannelLayerNorm.forward = norm  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------------------------- export


def _export(module: nn.Module, args: tuple[Tensor, ...], path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]], opset: int) -> None:
    """Trace ``module`` to ``path`` with the TorchScript exporter (no extra dependencies, stable dynamic axes)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shape arithmetic are expected here
        # (torch.onnx.export's parameters are partly untyped)
        torch.onnx.export(module, args, str(path), dynamo=False,  # pyright: ignore[reportUnknownMemberType]
                          input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True)


def export_onnx(gpt_ckpt: str | os.PathLike[str], sovits_ckpt: str | os.PathLike[str],
                out_dir: str | os.PathLike[str], opset: int = DEFAULT_OPSET) -> dict[str, Path]:
    """Export the five graphs of a GPT + SoVITS (v2, v2Pro, v2ProPlus) checkpoint pair to ``out_dir`` (+ manifest).

    Parameters
    ----------
    gpt_ckpt, sovits_ckpt:
        upstream-format checkpoints (``.ckpt`` / ``.pth``).
    out_dir:
        target folder; written atomically (a temporary sibling folder renamed into place), replacing an old export.
    opset:
        ONNX opset (17 or later).

    Returns
    -------
    dict
        graph name (see :data:`GRAPHS`) -> path of its ``.onnx`` file, plus ``"manifest"``.
    """
    if opset < 17:
        raise EngineError(f"opset {opset} is too old: the graphs need LayerNormalization (opset 17+)")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(gpt_ckpt), "cpu", torch.float32)
    sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(sovits_ckpt), "cpu", torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _export_gpt(gpt, tmp, opset)
        _export_sovits(sovits, tmp, opset)
        manifest = _manifest(gpt, sovits, gpt_ckpt, sovits_ckpt, opset)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported ONNX graphs to %s", out)
    paths = {name: out / f"{name}.onnx" for name in GRAPHS}
    paths["manifest"] = out / MANIFEST
    return paths


def _export_gpt(gpt: Text2SemanticModel, out: Path, opset: int) -> None:
    """Write gpt_prefill.onnx and gpt_step.onnx."""
    cfg = gpt.config
    g = torch.Generator().manual_seed(0)
    tx, tp = 7, 5  # distinct example lengths, so the tracer cannot confuse the axes
    args = (torch.randint(1, cfg.phoneme_vocab, (1, tx), generator=g), torch.randn(1, BERT_DIM, tx, generator=g),
            torch.randint(0, cfg.vocab - 1, (1, tp), generator=g))
    _export(_GptPrefill(gpt).eval(), args, out / "gpt_prefill.onnx", ["phones", "bert", "prompt"],
            ["logits", "keys", "values"],
            {"phones": {1: "tx"}, "bert": {2: "tx"}, "prompt": {1: "tp"}, "keys": {3: "s"}, "values": {2: "s"}},
            opset)
    b, t = 2, 9
    past: list[Tensor] = []
    names: list[str] = []
    axes: dict[str, dict[int, str]] = {"tokens": {0: "b"}, "audio_pos": {0: "b"}, "kv_bias": {0: "b", 1: "t"},
                                       "logits": {0: "b"}, "new_k": {1: "b"}, "new_v": {1: "b"}}
    for i in range(cfg.layers):
        past += [torch.randn(b, cfg.heads, cfg.head_dim, t, generator=g),
                 torch.randn(b, cfg.heads, t, cfg.head_dim, generator=g)]
        names += [f"past_k_{i}", f"past_v_{i}"]
        axes[f"past_k_{i}"] = {0: "b", 3: "t"}
        axes[f"past_v_{i}"] = {0: "b", 2: "t"}
    args = (torch.randint(0, cfg.vocab, (b,), generator=g), torch.tensor([3, 4]), torch.zeros(b, t), *past)
    _export(_GptStep(gpt).eval(), args, out / "gpt_step.onnx", ["tokens", "audio_pos", "kv_bias", *names],
            ["logits", "new_k", "new_v"], axes, opset)


def _export_sovits(sovits: SoVITSDecoder, out: Path, opset: int) -> None:
    """Write sovits_decode.onnx, ref_style.onnx and extract_latent.onnx."""
    cfg = sovits.cfg
    g = torch.Generator().manual_seed(0)
    ts, tt = 6, 5
    args = (torch.randint(0, 1024, (1, 1, ts), generator=g), torch.randint(1, cfg.n_symbols, (1, tt), generator=g),
            torch.randn(1, cfg.gin_channels, 1, generator=g), torch.zeros(1, cfg.inter_channels, 2 * ts))
    with _traceable_sovits():
        _export(_SovitsDecode(sovits).eval(), args, out / "sovits_decode.onnx", ["codes", "text", "ge", "noise"],
                ["wav"], {"codes": {2: "ts"}, "text": {1: "tt"}, "noise": {2: "frames"}, "wav": {2: "samples"}},
                opset)
    spec = (torch.rand(1, 1025, 11, generator=g),)
    if cfg.is_v2pro:  # v2Pro/v2ProPlus: a second input, the SV features of the same clip
        _export(_RefStyle(sovits).eval(), (*spec, torch.randn(1, cfg.sv_dim, generator=g)), out / "ref_style.onnx",
                ["spec", "sv"], ["ge"], {"spec": {0: "b", 2: "tr"}, "sv": {0: "b"}, "ge": {0: "b"}}, opset)
    else:
        _export(_RefStyle(sovits).eval(), spec, out / "ref_style.onnx", ["spec"], ["ge"],
                {"spec": {0: "b", 2: "tr"}, "ge": {0: "b"}}, opset)
    _export(_ExtractLatent(sovits).eval(), (torch.randn(1, SSL_DIM, 13, generator=g),), out / "extract_latent.onnx",
            ["ssl"], ["codes"], {"ssl": {0: "b", 2: "t50"}, "codes": {1: "b", 2: "t25"}}, opset)


def _manifest(gpt: Text2SemanticModel, sovits: SoVITSDecoder, gpt_ckpt: Any, sovits_ckpt: Any,
              opset: int) -> dict[str, Any]:
    """What a runtime needs to size its buffers without loading the checkpoints."""
    c, s = gpt.config, sovits.cfg
    return {
        "format": MANIFEST_FORMAT,
        "opset": opset,
        "gpt_fingerprint": file_fingerprint(gpt_ckpt),
        "sovits_fingerprint": file_fingerprint(sovits_ckpt),
        "gpt": {"dim": c.dim, "heads": c.heads, "layers": c.layers, "head_dim": c.head_dim, "vocab": c.vocab,
                "eos": c.eos, "phoneme_vocab": c.phoneme_vocab, "pe_positions": int(gpt.pe.shape[0])},
        "sovits": {"gin": s.gin_channels, "inter_channels": s.inter_channels, "hop": s.hop,
                   "n_symbols": s.n_symbols, "sampling_rate": s.sampling_rate, "version": s.version,
                   "sv_dim": s.sv_dim},
    }


def model_key(models: ModelPaths) -> str:
    """Folder name of a checkpoint pair's export: a hash of both files' fingerprints."""
    return model_id(models, str(MANIFEST_FORMAT))


def ensure_onnx(models: ModelPaths, onnx_dir: str | os.PathLike[str], opset: int = DEFAULT_OPSET) -> Path:
    """The export folder of ``models`` under ``onnx_dir`` (``<onnx_dir>/<model key>``), exporting it if missing.

    Raises
    ------
    EngineError
        a checkpoint file is missing, or the export fails.
    """
    require_model_files(models)
    folder = Path(onnx_dir) / model_key(models)
    if (folder / MANIFEST).is_file() and all((folder / f"{n}.onnx").is_file() for n in GRAPHS):
        return folder
    log.info("exporting ONNX graphs for %s + %s (once per model pair)", models.gpt, models.sovits)
    try:
        export_onnx(models.gpt, models.sovits, folder, opset)
    except EngineError:
        raise
    except Exception as e:  # the exporter raises many kinds of errors
        raise EngineError(f"ONNX export into {folder} failed: {e}") from e
    return folder


def load_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an export folder's ``manifest.json`` (checked for the current format)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EngineError(f"{path} is missing or unreadable ({e}); delete {folder} to export again") from e
    if manifest.get("format") != MANIFEST_FORMAT:
        raise EngineError(f"{path} is from another version of voicebot; delete {folder} to export again")
    return manifest


def quantize_step_int8(folder: str | os.PathLike[str]) -> Path:
    """ORT dynamic int8 quantisation of the step graph's transformer MatMuls (weights 7-bit int8 per channel).

    Embeddings, layer norms, attention products and the output head stay fp32, so the logits keep their range.
    Written once as ``gpt_step.int8.onnx`` next to the fp32 graph.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = Path(folder)
    out = folder / f"{INT8_STEP}.onnx"
    if out.is_file():
        return out
    import onnx

    model = onnx.load(str(folder / "gpt_step.onnx"))  # pyright: ignore[reportUnknownMemberType]  # (onnx types its path as a bare PathLike)
    weights = {i.name for i in model.graph.initializer}
    # only MatMuls against a weight matrix (the linears), never the attention products nor the output head
    linears = [n.name for n in model.graph.node if n.op_type == "MatMul" and any(x in weights for x in n.input)]
    head = [n.name for n in model.graph.node if n.op_type == "MatMul" and "logits" in _consumers_to_output(model, n)]
    nodes = [n for n in linears if n not in head]
    tmp = out.with_suffix(".tmp.onnx")
    # reduce_range: 7-bit weights, so no u8 x s8 pair sum saturates the int16 step of AVX2 / AVX-512 (non-VNNI)
    # kernels; the int32 products are then exact on every CPU and the result does not depend on its ISA.
    quantize_dynamic(str(folder / "gpt_step.onnx"), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                     reduce_range=True, op_types_to_quantize=["MatMul"], nodes_to_quantize=nodes)
    os.replace(tmp, out)
    return out


def _consumers_to_output(model: Any, node: Any) -> set[str]:
    """Graph outputs reachable from ``node`` through single-input-chain ops (Squeeze/Reshape/Identity)."""
    outputs = {o.name for o in model.graph.output}
    names: set[str] = set()
    frontier = list(node.output)
    passthrough = {"Squeeze", "Reshape", "Identity", "Unsqueeze"}
    while frontier:
        name = frontier.pop()
        if name in outputs:
            names.add(name)
        for n in model.graph.node:
            if name in n.input and n.op_type in passthrough:
                frontier.extend(n.output)
    return names


# ------------------------------------------------------------------------------------------------------- checks


def graph_ops(path: str | os.PathLike[str]) -> set[str]:
    """Every operator type in an ONNX file, subgraphs included (``domain::Op`` for non-standard domains)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # pyright: ignore[reportUnknownMemberType]  # (onnx types its path as a bare PathLike)
    ops: set[str] = set()

    def visit(graph: Any) -> None:
        for node in graph.node:
            ops.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}")
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(model.graph)
    return ops


def check_graphs(directory: str | os.PathLike[str], names: tuple[str, ...] = GRAPHS) -> dict[str, list[str]]:
    """Validate the exported graphs: ``onnx.checker`` (full check) and TensorRT 10 operator support.

    Parameters
    ----------
    directory:
        an export folder (see :func:`export_onnx`).
    names:
        graphs to check.

    Returns
    -------
    dict
        graph name -> sorted operator types it uses.

    Raises
    ------
    EngineError
        a graph is missing or invalid, or uses an operator TensorRT 10 cannot parse or one that is forbidden
        (random or spectral ops belong outside the graphs).
    """
    import onnx

    folder = Path(directory)
    result: dict[str, list[str]] = {}
    problems: list[str] = []
    for name in names:
        path = folder / f"{name}.onnx"
        if not path.is_file():
            problems.append(f"{name}: {path} is missing")
            continue
        try:
            onnx.checker.check_model(str(path), full_check=True)  # pyright: ignore[reportUnknownMemberType]  # (onnx types its path as a bare PathLike)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            problems.append(f"{name}: onnx.checker: {e}")
        ops = graph_ops(path)
        bad = sorted(ops - TRT_SUPPORTED_OPS)
        forbidden = sorted(ops & FORBIDDEN_OPS)
        if bad:
            problems.append(f"{name}: operators TensorRT 10 cannot parse: {', '.join(bad)}")
        if forbidden:
            problems.append(f"{name}: forbidden operators: {', '.join(forbidden)}")
        result[name] = sorted(ops)
    if problems:
        raise EngineError("ONNX graph check failed in " + str(folder) + ":\n  " + "\n  ".join(problems))
    return result
