"""The straightforward GPT decode loop, as upstream's ``infer_panel_naive`` runs it: the benchmark's baseline.

Same maths as :mod:`engines.gpt_sovits.generate`, written the upstream way: the K/V caches grow with ``torch.cat``
every step, the sampler gathers and scatters over the whole token history, the mask is rebuilt, and the stop test
reads the device every token (``.item()``). It reads the weights of a :class:`Text2SemanticModel` but shares none of
its code paths, so it doubles as an independent check of the fast path (same greedy tokens).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from engines.base import MAX_DECODE_STEPS, SamplingParams
from engines.gpt_sovits.gpt import Block, Text2SemanticModel
from engines.gpt_sovits.sampling import MIN_STEPS_BEFORE_EOS, MIN_TEMPERATURE

__all__ = ["naive_generate"]


@torch.inference_mode()
def naive_generate(
    model: Text2SemanticModel,
    phones: np.ndarray,
    bert: np.ndarray,
    prompt_tokens: np.ndarray,
    params: SamplingParams,
) -> np.ndarray:
    """Generate semantic tokens for one request, upstream-style (growing cache, host sync per token).

    Parameters
    ----------
    model: supplies the weights (fp32; not the int8 variant).
    phones: ``[Tx]`` int64 prompt + target phones.
    bert: ``[1024, Tx]`` float32.
    prompt_tokens: ``[Tp]`` int64 (empty: reference-free).
    params: sampling options; ``seed`` seeds a ``torch.Generator`` (greedy ``top_k=1`` matches the fast path).

    Returns
    -------
    ``[Ts]`` int64 new tokens with upstream's ``y[-idx:]`` semantics.
    """
    if model.quantized:
        raise ValueError("naive_generate needs the fp32 model, not the int8 one")
    cfg = model.config
    dev = model.device
    gen = torch.Generator(device=dev)
    gen.manual_seed(params.seed if params.seed is not None else torch.seed())
    layers = [_layer_weights(blk) for blk in model.h.blocks]
    head_w = model.ar_predict_layer.weight
    pe = model.pe

    x = torch.as_tensor(np.asarray(phones, dtype=np.int64), device=dev)[None]
    b = torch.as_tensor(np.asarray(bert, dtype=np.float32), device=dev)[None]
    x = F.embedding(x, model.ar_text_embedding.word_embeddings.weight) + F.linear(
        b.transpose(1, 2), model.bert_proj.weight, model.bert_proj.bias
    )
    x = x + model.ar_text_position.alpha * pe[: x.shape[1]]
    x_len = x.shape[1]
    y = torch.as_tensor(np.asarray(prompt_tokens, dtype=np.int64), device=dev)[None]
    y_len = prefix_len = y.shape[1]
    ref_free = y_len == 0
    if not ref_free:
        y_pos = F.embedding(y, model.ar_audio_embedding.word_embeddings.weight)
        y_pos = y_pos + model.ar_audio_position.alpha * pe[:y_len]
        xy_pos = torch.cat([x, y_pos], dim=1)
    else:
        xy_pos = x
    # True = blocked: text rows never see audio columns; audio rows see text, and audio causally.
    x_mask = F.pad(torch.zeros(x_len, x_len, dtype=torch.bool, device=dev), (0, y_len), value=True)
    y_mask = F.pad(torch.ones(y_len, y_len, dtype=torch.bool, device=dev).triu(1), (x_len, 0), value=False)
    blocked = torch.cat([x_mask, y_mask], dim=0)

    k_caches: list[torch.Tensor] = []
    v_caches: list[torch.Tensor] = []
    idx = 0
    for idx in range(MAX_DECODE_STEPS):
        h = xy_pos
        for i, w in enumerate(layers):
            q, k, v = F.linear(h, w["qkv_w"], w["qkv_b"]).chunk(3, dim=-1)
            if idx == 0:
                k_caches.append(k)
                v_caches.append(v)
            else:
                k_caches[i] = torch.cat([k_caches[i], k], dim=1)
                v_caches[i] = torch.cat([v_caches[i], v], dim=1)
            h = _attend_and_mlp(h, q, k_caches[i], v_caches[i], ~blocked if idx == 0 else None, w, cfg.heads)
        logits = F.linear(h[:, -1], head_w)
        if idx < MIN_STEPS_BEFORE_EOS:
            logits = logits[:, :-1]
        samples = _sample(logits, y, params, gen)
        y = torch.cat([y, samples], dim=1)
        stop = params.early_stop_num != -1 and (y.shape[1] - prefix_len) > params.early_stop_num
        if torch.argmax(logits, dim=-1)[0].item() == cfg.eos or samples[0, 0].item() == cfg.eos:
            stop = True
            y = y[:, :-1]
        if idx == MAX_DECODE_STEPS - 1:
            stop = True
        if stop:
            if y.shape[1] == 0:
                y = torch.cat([y, torch.zeros_like(samples)], dim=1)
            break
        xy_pos = F.embedding(y[:, -1:], model.ar_audio_embedding.word_embeddings.weight)
        xy_pos = xy_pos + model.ar_audio_position.alpha * pe[y_len + idx]
    out = y[0, prefix_len:].cpu().numpy()
    if ref_free:
        return out.astype(np.int64)
    if idx == 0:
        return out.astype(np.int64)  # upstream's y[-0:] would include the prompt; keep just the new token
    return y[0, -idx:].cpu().numpy().astype(np.int64)


def _layer_weights(blk: Block) -> dict[str, torch.Tensor]:
    """One layer's tensors, fp32."""
    a = blk.self_attn
    return {
        "qkv_w": a.in_proj.weight.float(), "qkv_b": a.in_proj.bias.float(),
        "out_w": a.out_proj.weight.float(), "out_b": a.out_proj.bias.float(),
        "w1": blk.linear1.weight.float(), "b1": blk.linear1.bias.float(),
        "w2": blk.linear2.weight.float(), "b2": blk.linear2.bias.float(),
        "n1w": blk.norm1.weight, "n1b": blk.norm1.bias, "n2w": blk.norm2.weight, "n2b": blk.norm2.bias,
    }


def _attend_and_mlp(
    x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
    w: dict[str, torch.Tensor], heads: int,
) -> torch.Tensor:
    """Attention over the whole cache, then the post-LN residual blocks, as upstream's T2SBlock."""
    bsz, q_len, dim = q.shape
    kv_len = k.shape[1]
    q = q.view(bsz, q_len, heads, -1).transpose(1, 2)
    k = k.view(bsz, kv_len, heads, -1).transpose(1, 2)
    v = v.view(bsz, kv_len, heads, -1).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, allowed)
    a = F.linear(a.transpose(1, 2).reshape(bsz, q_len, -1), w["out_w"], w["out_b"])
    x = F.layer_norm(x + a, [dim], w["n1w"], w["n1b"])
    x = x + F.linear(F.relu(F.linear(x, w["w1"], w["b1"])), w["w2"], w["b2"])
    return F.layer_norm(x, [dim], w["n2w"], w["n2b"])


def _sample(logits: torch.Tensor, history: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    """Upstream's sampler: penalty in place over the token history, top-p, temperature, top-k, exponential race."""
    if history.shape[1] and p.repetition_penalty != 1.0:
        prev = history.long()
        score = torch.gather(logits, 1, prev)
        score = torch.where(score < 0, score * p.repetition_penalty, score / p.repetition_penalty)
        logits.scatter_(1, prev, score)  # in place: the EOS test reads the penalised logits
    x = logits
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(x, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        drop = cum > p.top_p
        drop[:, 0] = False
        x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    x = x / max(p.temperature, MIN_TEMPERATURE)
    pivot = torch.topk(x, min(p.top_k, x.shape[-1])).values[:, -1:]
    x = torch.where(x < pivot, float("-inf"), x)
    probs = torch.softmax(x, dim=-1)
    q = torch.empty_like(probs).exponential_(1, generator=gen)
    return torch.argmax(probs / q, dim=-1, keepdim=True)
