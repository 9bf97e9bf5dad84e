"""The GPT decode loop: prefill a request into a cache slot, then decode all slots together, one token per step.

Every row keeps its own length, so requests join (:meth:`BatchDecoder.add`) and leave between steps: continuous
batching. The device state lives in static buffers (next token, position, step, seen-token mask, sampled tokens,
EOS step), updated in place by :meth:`BatchDecoder.graphable_step`, which never syncs with the host. The host knows
every row's length and cap without asking the device; it reads the device only every ``sync_every`` steps (or when
a row reaches its cap) to find rows that sampled EOS. Tokens a row samples after its EOS, before that check, are
discarded, so results are exactly those of a token-by-token loop.

Stopping follows upstream (reference 5.4): EOS by the penalised argmax or by the sample (dropped); ``early_stop_num``
and the 1500-step cap keep the last sample, and then upstream's ``y[-idx:]`` drops the *first* generated token (not
for reference-free rows); an empty result becomes ``[0]``.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
import dataclasses
from typing import Callable, Hashable, Protocol, Sequence

import numpy as np
import torch

from engines.base import MAX_DECODE_STEPS, EngineError, SamplingParams, SemanticRequest
from engines.gpt_sovits.gpt import KV_BUCKET, GptConfig
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.sampling import MIN_STEPS_BEFORE_EOS, SamplerState, sample_step

log = logging.getLogger(__name__)

__all__ = ["BatchDecoder", "CudaGraphStep", "DecodeModel", "SlotBatch", "generate", "request_inputs", "MAX_CONTEXT",
           "SYNC_EVERY"]

SYNC_EVERY = 8  # decode steps between host reads of the EOS flags
GENERATE_MAX_SLOTS = 16  # generate(): rows decoded at once; further requests wait for a free slot
_LEN_ROUND = 256  # generate(): cache length rounded up to this many positions (fewer reallocations)

MAX_CONTEXT = 2048  # KV positions per slot: prompt phones + text + prompt tokens + generated tokens

TokenHook = Callable[[Hashable, np.ndarray], None]


class DecodeModel(Protocol):
    """What :class:`BatchDecoder` needs from a GPT: the torch model, or the graph engines' :class:`GraphGpt`."""

    config: GptConfig
    max_len: int  # cache positions per row, as sized by the last setup_caches

    @property
    def device(self) -> torch.device: ...

    @property
    def bert_dim(self) -> int: ...

    def setup_caches(self, max_slots: int, max_len: int) -> None: ...

    def prefill(self, slot: int, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor: ...

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None = None,
                    kv_len: int = 0) -> torch.Tensor: ...


@dataclass
class _Row:
    """Host-side bookkeeping of one active request."""

    request_id: Hashable
    slot: int
    prefix_len: int  # Tx + Tp: cache positions filled by the prefill
    ref_free: bool  # no prompt tokens: upstream returns every generated token
    last_step: int  # index of the last step allowed (early_stop_num / 1500 cap)
    top_k: int
    top_p: float
    steps: int = 0  # steps sampled so far (mirror of the device counter)
    sent: int = 0  # tokens already handed to on_chunk


class BatchDecoder:
    """Continuous-batching decoder over a GPT's static KV cache (a :class:`DecodeModel`).

    Parameters
    ----------
    model: the GPT (its cache is set up here, at least ``max_slots x max_len``).
    max_slots: rows decoded together.
    max_len: cache positions per row; a request needs ``Tx + Tp + its step cap`` of them.
    on_chunk: optional ``(request_id, new_tokens [n] int64)`` hook, fed at every host sync with the tokens
        generated since the last call (the first token included even where the final result drops it).
    sync_every: decode steps between host reads of the EOS flags.
    bucket_rows: round the decoded row count up to a power of two (stable shapes for CUDA graphs).

    Notes
    -----
    All calls run under ``torch.inference_mode``. Not thread-safe: drive it from one thread.
    """

    def __init__(
        self,
        model: DecodeModel,
        max_slots: int,
        max_len: int,
        on_chunk: TokenHook | None = None,
        sync_every: int = SYNC_EVERY,
        bucket_rows: bool = False,
    ) -> None:
        if max_slots < 1 or max_len < 2:
            raise ValueError(f"max_slots must be >= 1 and max_len >= 2, got {max_slots}, {max_len}")
        self.model = model
        self.max_slots, self.max_len = max_slots, max_len
        self.on_chunk, self.sync_every, self.bucket_rows = on_chunk, max(1, sync_every), bucket_rows
        with torch.inference_mode():
            model.setup_caches(max_slots, max_len)
            dev, v = model.device, model.config.vocab
            long = dict(dtype=torch.long, device=dev)
            self.tokens = torch.zeros(max_slots, MAX_DECODE_STEPS + 1, **long)  # [slots, 1501]; last col scratch
            self.seen = torch.zeros(max_slots, v, dtype=torch.bool, device=dev)  # [slots, V] repetition mask
            self.next_token = torch.zeros(max_slots, **long)  # [slots] token fed to the next decode
            self.positions = torch.zeros(max_slots, **long)  # [slots] cache index of that token
            self.steps = torch.zeros(max_slots, **long)  # [slots] steps sampled (upstream idx of the next one)
            self.live = torch.zeros(max_slots, **long)  # [slots] 1 while the row still decodes
            self.eos_at = torch.full((max_slots,), -1, **long)  # [slots] step of the first EOS, -1: none yet
            self.sampler = SamplerState.allocate(max_slots, dev)
        lib = cpu_step.load_library() if dev.type == "cpu" else None
        # On a CPU the sampling step is one C call (the torch sampler's ~35 small ops cost 0.5-2 ms a step there)
        self._c_sampler = None if lib is None else cpu_step.Sampler(lib, v, model.config.eos, MIN_STEPS_BEFORE_EOS)
        # What step() calls for one decode: (rows, kv_len) -> None. The torch engine may swap in a function that
        # replays a CUDA graph captured from graphable_step for that (rows, kv_len) bucket.
        self.run_step: Callable[[int, int], None] = self.graphable_step
        self._rows: dict[int, _Row] = {}  # slot -> row
        self._slot_of: dict[Hashable, int] = {}
        self._since_sync = 0
        self._max_top_k, self._use_top_p = 1, False

    # ------------------------------------------------------------------ public API

    @property
    def active(self) -> tuple[Hashable, ...]:
        """Request ids in flight (added, not yet returned by :meth:`step` nor cancelled)."""
        return tuple(r.request_id for r in self._rows.values())

    @property
    def free_slots(self) -> int:
        """How many more requests :meth:`add` accepts now."""
        return self.max_slots - len(self._rows)

    @torch.inference_mode()
    def add(
        self,
        request_id: Hashable,
        phones: np.ndarray,
        bert: np.ndarray,
        prompt_tokens: np.ndarray,
        params: SamplingParams,
    ) -> None:
        """Prefill one request into a free slot and sample its first token (callable between steps).

        Parameters
        ----------
        request_id: any hashable, unique among active requests.
        phones: ``[Tx]`` int64, prompt phones + target phones.
        bert: ``[1024, Tx]`` float32.
        prompt_tokens: ``[Tp]`` int64 (empty: reference-free).
        params: sampling options; ``params.seed`` fixes the tokens whatever the batch.
        """
        if request_id in self._slot_of:
            raise ValueError(f"request {request_id!r} is already active")
        if not self.free_slots:
            raise EngineError(f"all {self.max_slots} decode slots are busy; wait for step() to finish a request")
        tx, tp = int(len(phones)), int(len(prompt_tokens))
        if tx == 0:
            raise EngineError("a GPT request needs at least one phone; the sentence produced no phones")
        if bert.shape != (self.model.bert_dim, tx):
            raise ValueError(f"bert must be [{self.model.bert_dim}, {tx}], got {list(bert.shape)}")
        esn = params.early_stop_num
        last_step = MAX_DECODE_STEPS - 1 if esn < 0 else min(MAX_DECODE_STEPS - 1, esn)
        if tx + tp + last_step + 1 > self.max_len:
            raise EngineError(
                f"request needs {tx + tp + last_step + 1} cache positions ({tx} phones, {tp} prompt tokens, "
                f"{last_step + 1} steps) but the decoder has {self.max_len}; raise max_len or shorten the sentence"
            )
        slot = min(set(range(self.max_slots)) - set(self._rows))
        dev = self.model.device
        prompt = torch.as_tensor(np.asarray(prompt_tokens, dtype=np.int64), device=dev)
        logits = self.model.prefill(
            slot,
            torch.as_tensor(np.asarray(phones, dtype=np.int64), device=dev),
            torch.as_tensor(np.asarray(bert, dtype=np.float32), device=dev),
            prompt,
        )
        self.seen[slot] = False
        if tp:
            self.seen[slot, prompt] = True
        self.steps[slot] = 0
        self.positions[slot] = tx + tp
        self.eos_at[slot] = -1
        self.live[slot] = 1 if last_step > 0 else 0
        self.sampler.set_row(slot, params, self.model.config.vocab)
        row = _Row(request_id, slot, tx + tp, tp == 0, last_step, params.top_k, params.top_p)
        self._rows[slot], self._slot_of[request_id] = row, slot
        self._refresh_limits()
        # Step 0 samples from the prefill's logits; the token is written at position tx + tp by the next decode.
        self._sample_rows(slice(slot, slot + 1), logits[None], live=torch.ones(1, dtype=torch.long, device=dev))
        row.steps = 1

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, np.ndarray]]:
        """Decode one token for every running row; returns the requests that finished, with their new tokens."""
        running = [r for r in self._rows.values() if r.steps <= r.last_step]
        if running:
            b = max(r.slot for r in running) + 1
            if self.bucket_rows:
                b = min(self.max_slots, 1 << (b - 1).bit_length())
            kv_len = max(r.prefix_len + r.steps for r in running)  # last write index + 1
            kv_len = min(self.max_len, -(-kv_len // KV_BUCKET) * KV_BUCKET)
            self.run_step(b, kv_len)
            self._since_sync += 1
            for r in running:
                r.steps += 1
                if r.steps > r.last_step:
                    self.live[r.slot] = 0  # capped: keep its tokens, stop decoding it
        if not self._rows:
            return []
        capped = any(r.steps > r.last_step for r in self._rows.values())
        if capped or self._since_sync >= self.sync_every:
            return self._sync()
        return []

    @torch.inference_mode()
    def cancel(self, request_id: Hashable) -> bool:
        """Drop a request now (its slot is free at once); returns False if it was not active."""
        slot = self._slot_of.pop(request_id, None)
        if slot is None:
            return False
        self._free(slot)
        return True

    @property
    def sampler_bounds(self) -> tuple[int, bool]:
        """(top-k width, top-p on): with ``(rows, kv_len)`` the static key of one :meth:`graphable_step` shape."""
        return self._max_top_k, self._use_top_p

    def graphable_step(self, rows: int, kv_len: int) -> None:
        """One decode + sample for rows ``0..rows-1`` on the static buffers, in place, with no host sync.

        The work depends only on ``(rows, kv_len)`` and :attr:`sampler_bounds`, so a CUDA graph captured per such
        key can replace this call (see :attr:`run_step`); inputs and outputs are this object's buffers.
        """
        logits = self.model.decode_step(self.next_token[:rows], self.positions[:rows], None, kv_len)
        self.positions[:rows] += self.live[:rows]
        self._sample_rows(slice(0, rows), logits, self.live[:rows])

    # ------------------------------------------------------------------ internals

    def _sample_rows(self, sl: slice, logits: torch.Tensor, live: torch.Tensor) -> None:
        """Sample rows ``sl`` from ``logits`` and update their device state in place."""
        steps = self.steps[sl]
        if self._c_sampler is not None and not self._use_top_p:
            st = self.sampler.rows(sl)
            self._c_sampler(logits, self.seen[sl], self.tokens[sl], steps, self.eos_at[sl], self.next_token[sl], live,
                            st.top_k, st.temperature, st.repetition_penalty, st.key)
            return
        tok, stop = sample_step(logits, self.seen[sl], steps, self.sampler.rows(sl), self._max_top_k,
                                self._use_top_p, self.model.config.eos)
        self.tokens[sl].scatter_(1, steps[:, None], tok[:, None])
        self.seen[sl].scatter_(1, tok[:, None], True)
        eos_at = self.eos_at[sl]
        eos_at.copy_(torch.where((eos_at < 0) & stop & (live > 0), steps, eos_at))
        self.next_token[sl] = tok
        steps += live

    def _sync(self) -> list[tuple[Hashable, np.ndarray]]:
        """Read EOS flags (one host sync), feed on_chunk, and return and free the finished rows."""
        self._since_sync = 0
        eos_at = self.eos_at.tolist()
        ends = {}  # slot -> (end of valid tokens, finished)
        for slot, r in self._rows.items():
            e = eos_at[slot]
            if e >= 0:
                ends[slot] = (e, True)
            else:
                ends[slot] = (min(r.steps, r.last_step + 1), r.steps > r.last_step)
        need = [s for s, (end, done) in ends.items() if done or (self.on_chunk and end > self._rows[s].sent)]
        if not need:
            return []
        width = max(ends[s][0] for s in need)
        host = self.tokens[: max(need) + 1, :width].cpu().numpy()
        finished: list[tuple[Hashable, np.ndarray]] = []
        for slot in need:
            r, (end, done) = self._rows[slot], ends[slot]
            gen = host[slot, :end]
            if self.on_chunk is not None and end > r.sent:
                self.on_chunk(r.request_id, gen[r.sent:].copy())
                r.sent = end
            if done:
                by_eos = eos_at[slot] >= 0
                out = gen if (by_eos or r.ref_free or r.last_step == 0) else gen[1:]  # upstream's y[-idx:]
                if out.size == 0:
                    out = np.zeros(1, dtype=np.int64)  # upstream's "bad zero prediction"
                finished.append((r.request_id, out.astype(np.int64, copy=True)))
                del self._slot_of[r.request_id]
                self._free(slot)
        return finished

    def _free(self, slot: int) -> None:
        """Release a slot: its row decodes as an idle dummy until reused."""
        del self._rows[slot]
        self.live[slot] = 0
        self.positions[slot] = 0
        self.next_token[slot] = 0
        self._refresh_limits()

    def _refresh_limits(self) -> None:
        """Static sampler bounds over the active rows: top-k width and whether any row uses top-p."""
        rows = self._rows.values()
        top_k = max((r.top_k for r in rows), default=1)
        # A power of two: the width only has to cover every row's k, and few distinct widths mean few CUDA graphs.
        self._max_top_k = min(self.model.config.vocab, 1 << (top_k - 1).bit_length())
        self._use_top_p = any(r.top_p < 1.0 for r in rows)


class CudaGraphStep:
    """A :attr:`BatchDecoder.run_step` that replays one CUDA graph per decode shape.

    The first call of a shape (rows, kv_len, sampler bounds) runs eagerly on a side stream (the warm-up the
    capture needs) and then captures; later calls replay. Shapes are bucketed by the decoder (``bucket_rows`` and
    the KV bucket), so the number of graphs stays small.
    """

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self.replays = 0

    def __call__(self, rows: int, kv_len: int) -> None:
        key = (rows, kv_len, *self.decoder.sampler_bounds)
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.decoder.graphable_step(rows, kv_len)  # this step, for real, and the capture's warm-up
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: on a GPU the vocoder runs in a thread of its own, and a capture in the default "global"
        # mode would fail that thread's allocations (cudaMalloc is capture-unsafe) while this thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # recorded, not executed
            self.decoder.graphable_step(rows, kv_len)
        self.graphs[key] = graph


def generate(
    model: DecodeModel,
    requests: Sequence[SemanticRequest],
    on_chunk: Callable[[int, np.ndarray], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
    max_slots: int = GENERATE_MAX_SLOTS,
) -> list[np.ndarray]:
    """Run the GPT for several sentences at once; returns the new semantic tokens ``[Ts]`` int64 per request.

    Parameters
    ----------
    model: the GPT.
    requests: target phones/BERT plus the voice's prompt (reference-free when the voice has no prompt).
    on_chunk: ``(request_index, new_tokens)``, called as tokens become available (every few steps).
    should_stop: ``(request_index) -> True`` cancels that request between steps; its result is an empty array.
    max_slots: rows decoded together; more requests wait for a free slot.
    """
    if not requests:
        return []
    inputs = [request_inputs(r) for r in requests]
    need = max(len(ph) + len(pt) + _steps_cap(r.params) for r, (ph, _, pt) in zip(requests, inputs))
    max_len = max(model.max_len, -(-need // _LEN_ROUND) * _LEN_ROUND)
    slots = max(1, min(max_slots, len(requests)))
    decoder = BatchDecoder(model, slots, max_len, on_chunk=on_chunk)
    results: list[np.ndarray | None] = [None] * len(requests)
    pending = deque(range(len(requests)))
    while pending or decoder.active:
        while pending and decoder.free_slots:
            i = pending.popleft()
            decoder.add(i, *inputs[i], requests[i].params)
        if should_stop is not None:
            for i in decoder.active:
                if should_stop(i):  # type: ignore[arg-type]
                    decoder.cancel(i)
                    results[i] = np.zeros(0, dtype=np.int64)  # type: ignore[index]
        for i, tokens in decoder.step():
            results[i] = tokens  # type: ignore[index]
    return [r if r is not None else np.zeros(0, dtype=np.int64) for r in results]


class SlotBatch:
    """The engines' :class:`~engines.base.SemanticBatch`: requests in, a :class:`BatchDecoder` under it; each request's
    step cap is clamped to what its cache row holds, so every backend admits and cuts requests identically."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self._decoder = decoder

    @property
    def active(self) -> int:
        return len(self._decoder.active)

    @property
    def capacity(self) -> int:  # noqa: D102
        return self._decoder.max_slots

    def add(self, request_id: int, request: SemanticRequest) -> None:
        phones, bert, prompt = request_inputs(request)
        params = request.params
        room = self._decoder.max_len - len(phones) - len(prompt) - 1  # steps that fit in the cache
        if room < 1:
            raise EngineError(f"the sentence is too long for the GPT ({len(phones)} phones with the prompt); "
                              f"split it into shorter sentences")
        if params.early_stop_num < 0 or params.early_stop_num > room:
            params = dataclasses.replace(params, early_stop_num=min(room, MAX_DECODE_STEPS - 1)
                                         if params.early_stop_num < 0 else room)
        self._decoder.add(request_id, phones, bert, prompt, params)

    def step(self) -> list[tuple[int, np.ndarray]]:
        return self._decoder.step()

    def cancel(self, request_id: int) -> None:
        self._decoder.cancel(request_id)


def request_inputs(req: SemanticRequest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all phones, all BERT, prompt tokens) as upstream builds them; reference-free drops the prompt parts."""
    phones = np.asarray(req.phones, dtype=np.int64).reshape(-1)
    bert = np.asarray(req.bert, dtype=np.float32)
    v = req.voice
    if v.reference_free:
        return phones, bert, np.zeros(0, dtype=np.int64)
    return (
        np.concatenate([np.asarray(v.prompt_phones, dtype=np.int64).reshape(-1), phones]),
        np.concatenate([np.asarray(v.prompt_bert, dtype=np.float32), bert], axis=1),
        np.asarray(v.prompt_tokens, dtype=np.int64).reshape(-1),
    )


def _steps_cap(params: SamplingParams) -> int:
    """Most steps a request may run."""
    esn = params.early_stop_num
    return MAX_DECODE_STEPS if esn < 0 else min(MAX_DECODE_STEPS, esn + 1)
