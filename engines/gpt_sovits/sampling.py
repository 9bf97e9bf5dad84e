"""Batched, on-device token sampling with upstream GPT-SoVITS's exact rules (reference section 5.4).

Per step and row: no EOS during the first :data:`MIN_STEPS_BEFORE_EOS` steps; repetition penalty over every token
seen so far (prompt + generated, each once, EOS never); top-p on the penalised logits; temperature; top-k keeping
ties; softmax; then the exponential race ``argmax(probs / q)``, ``q ~ Exp(1)``. The row stops when the penalised
logits' argmax is EOS or the sample is EOS.

Randomness is counter-based: ``q`` is a pure function of (request seed, step, token id), computed with integer hash
arithmetic on the device. A request therefore draws exactly the same noise alone, in any batch, in any slot and on
CPU or CUDA; no generator state is carried between steps and nothing syncs with the host, so a step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TypeVar

import torch

from engines.base import EOS_TOKEN, SamplingParams

__all__ = ["logits_to_probs", "sample_step", "SamplerState", "seed_key", "MIN_STEPS_BEFORE_EOS"]

MIN_STEPS_BEFORE_EOS = 11  # steps 0..10 cannot produce EOS (>= 11 tokens = 0.44 s)
MIN_TEMPERATURE = 1e-5  # temperature floor, as upstream
_M32 = 0xFFFFFFFF  # 32-bit mask
_UNIFORM_BITS = 24  # bits of hash used for each uniform draw (exact in fp32)


def logits_to_probs(
    logits: torch.Tensor,
    previous_tokens: torch.Tensor | None,
    top_k: int,
    top_p: float,
    temperature: float,
    repetition_penalty: float,
) -> torch.Tensor:
    """Upstream's ``AR/models/utils.py:logits_to_probs`` on ``[B, V]`` logits; returns ``[B, V]`` fp32 probabilities.

    ``previous_tokens`` is ``[B, T]`` int64 (any T, duplicates allowed) or None. The input is not modified.
    """
    b, v = logits.shape
    seen = torch.zeros(b, v, dtype=torch.bool, device=logits.device)
    if previous_tokens is not None and previous_tokens.numel():
        seen.scatter_(1, previous_tokens.long(), True)
    def full(x: float, dt: torch.dtype) -> torch.Tensor:
        return torch.full((b,), x, dtype=dt, device=logits.device)

    _, filtered = _filter(
        logits.float(), seen, full(top_k, torch.long), full(top_p, torch.float32), full(temperature, torch.float32),
        full(repetition_penalty, torch.float32), max_top_k=top_k, use_top_p=top_p < 1.0,
    )
    return torch.softmax(filtered, dim=-1)


@dataclass
class SamplerState:
    """Per-row sampling parameters as device tensors ``[rows]`` (static buffers; a row = a cache slot)."""

    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float32
    temperature: torch.Tensor  # float32
    repetition_penalty: torch.Tensor  # float32
    key: torch.Tensor  # int64, 32-bit hash of the request's seed

    @classmethod
    def allocate(cls, rows: int, device: torch.device | str) -> SamplerState:
        """Buffers for ``rows`` rows, filled with upstream's defaults (those of :class:`SamplingParams`)."""
        def z(dt: torch.dtype, x: float) -> torch.Tensor:
            return torch.full((rows,), x, dtype=dt, device=device)

        d = SamplingParams()
        return cls(z(torch.long, d.top_k), z(torch.float32, d.top_p), z(torch.float32, d.temperature),
                   z(torch.float32, d.repetition_penalty), z(torch.long, 0))

    def set_row(self, row: int, params: SamplingParams, vocab: int) -> int:
        """Store one request's parameters in ``row``; returns the seed actually used."""
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.top_k[row] = min(params.top_k, vocab)
        self.top_p[row] = params.top_p
        self.temperature[row] = params.temperature
        self.repetition_penalty[row] = params.repetition_penalty
        self.key[row] = seed_key(seed)
        return seed

    def rows(self, sl: slice) -> SamplerState:
        """Views of rows ``sl``."""
        return SamplerState(self.top_k[sl], self.top_p[sl], self.temperature[sl], self.repetition_penalty[sl],
                            self.key[sl])


def sample_step(
    logits: torch.Tensor,
    seen: torch.Tensor,
    steps: torch.Tensor,
    state: SamplerState,
    max_top_k: int,
    use_top_p: bool,
    eos: int = EOS_TOKEN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Parameters
    ----------
    logits: ``[B, V]`` raw head output (any float dtype; computed in fp32).
    seen: ``[B, V]`` bool, tokens already in each row's sequence (prompt + generated), for the repetition penalty.
    steps: ``[B]`` int64, the 0-based step index of each row (upstream's ``idx``).
    state: the rows' parameters (``[B]`` tensors).
    max_top_k: ``>=`` every row's top_k (a static bound: the top-k width computed).
    use_top_p: False when no row has ``top_p < 1`` (skips the sort).

    Returns
    -------
    tokens: ``[B]`` int64 samples.
    stop: ``[B]`` bool, True where the row ends at this step (EOS by the penalised argmax or by the sample).
    """
    logits = logits.float()
    early = (steps < MIN_STEPS_BEFORE_EOS)[:, None]
    logits = logits.masked_fill(early & (_col_ids(logits) == eos), float("-inf"))
    penalised, filtered = _filter(logits, seen, state.top_k, state.top_p, state.temperature,
                                  state.repetition_penalty, max_top_k, use_top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.argmax(probs / _exponential(state.key, steps, logits.shape[1], logits.device), dim=-1)
    stop = (torch.argmax(penalised, dim=-1) == eos) | (tokens == eos)
    return tokens, stop


def seed_key(seed: int) -> int:
    """Fold a 64-bit seed into the 32-bit row key of the noise hash."""
    seed &= (1 << 64) - 1
    return _mix(_mix(seed & _M32) ^ _mix((seed >> 32) ^ 0x68E31DA4))


def _filter(
    logits: torch.Tensor,
    seen: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    temperature: torch.Tensor,
    repetition_penalty: torch.Tensor,
    max_top_k: int,
    use_top_p: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Penalty, top-p, temperature, top-k: returns (penalised logits, final filtered logits), both ``[B, V]`` fp32."""
    rp = repetition_penalty[:, None]
    penalised = torch.where(seen, torch.where(logits < 0, logits * rp, logits / rp), logits)
    x = penalised
    if use_top_p:
        sorted_logits, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        drop_sorted = (cum > top_p[:, None]) & (top_p < 1.0)[:, None]
        drop_sorted[:, 0] = False  # always keep the best
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    x = x / temperature.clamp(min=MIN_TEMPERATURE)[:, None]
    k = min(max_top_k, x.shape[1])
    top = torch.topk(x, k, dim=-1).values  # [B, k] descending
    pivot = top.gather(1, (top_k.clamp(max=k) - 1)[:, None])  # each row's k-th best
    x = torch.where(x < pivot, float("-inf"), x)
    return penalised, x


def _col_ids(x: torch.Tensor) -> torch.Tensor:
    """``[V]`` column indices of a ``[B, V]`` tensor."""
    return torch.arange(x.shape[1], device=x.device)


_Int = TypeVar("_Int", torch.Tensor, int)  # _mix and _mul32 work on either, and return the same kind


def _mul32(x: _Int, c: int) -> _Int:
    """``x * c mod 2**32`` for 32-bit ``x`` without int64 overflow (16-bit split of the constant)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix(x: _Int) -> _Int:
    """A 32-bit integer hash (xorshift-multiply avalanche) on Python ints or int64 tensors holding 32-bit values."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


_column_hashes: dict[tuple[int, str], torch.Tensor] = {}  # (vocab, device) -> [V] int64, built once


def _exponential(key: torch.Tensor, steps: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """``[B, V]`` fp32 Exp(1) noise, a pure function of (row key, step, column)."""
    col = _column_hashes.get((vocab, str(device)))
    if col is None:
        col = _column_hashes[(vocab, str(device))] = _mix(torch.arange(vocab, device=device) * 0x9E37 + 0x27D4EB2F)
    row = _mix(key ^ _mix(steps + 0x3C6EF372))  # [B]
    h = _mix(row[:, None] ^ col[None, :])  # [B, V] uniform 32-bit
    u = ((h >> (32 - _UNIFORM_BITS)).float() + 0.5) * (1.0 / (1 << _UNIFORM_BITS))  # (0, 1)
    return -torch.log(u)
