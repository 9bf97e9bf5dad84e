"""The int8 GPT proven on the loaded model the first time an engine plan runs it, as the int8 vocoder and BERT are.

Why: tests/engines/test_int8_proof.py bounds each int8 method's logits against upstream's along recorded greedy paths,
but only on the tiny golden models. A user's trained GPT may have weights that int8 rounds worse (one large weight in
a row sets that row's scale, and the row's other weights round to a few levels), so the bound is checked on the
loaded checkpoint itself before its int8 copy serves.

The proof: the fp32 GPT reads each built-in sentence (``gpt_sovits/proof_sentences.json``: one per language, our
front-end's phone ids, zero BERT features) reference-free, the one prompt an engine can make with no user voice, and
decodes greedily as upstream's top-1 does (repetition penalty 1.35, no EOS before step 11) for at most
:data:`PROOF_STEPS` tokens or until its EOS, every sentence a row of one batch (a step reads the weights once for
all). The int8 GPT, as the plan runs it, is fed the same tokens (teacher-forced), one sentence at a time, as its
bounds were measured (dynamic int8 rounds a batch's activations on one scale: coarser for rows batched together,
see FINDINGS.md#int8-gpt-proven-on-the-loaded-model). It passes when

- every step's raw logits are within the method's bound of fp32's (:data:`BOUNDS`: the ones test_int8_proof.py holds
  each method to against upstream), and
- the stop is kept: before fp32's stop, wherever fp32's choice leads EOS by more than the bound, int8 does not choose
  EOS; at fp32's stop, int8's EOS is within the bound of its best logit.

Measured at the real size with random weights: FINDINGS.md#int8-gpt-proven-on-the-loaded-model. The verdict is kept
(``gpt-int8-<key>.json`` in the engine's proof folder: the export folder of the model pair, or one beside it) with the
measured error, so a restart does not prove again; another GPT file, a changed one, another method, torch's or ONNX
Runtime's version or the sentences prove again. A miss runs the GPT in fp32, logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from engines.base import BERT_DIM, EOS_TOKEN, SamplingParams
from engines.gpt_sovits.gpt import KV_BUCKET
from engines.gpt_sovits.sampling import MIN_STEPS_BEFORE_EOS

log = logging.getLogger(__name__)

__all__ = ["BOUNDS", "GptDecoder", "GptProof", "PROOF_STEPS", "judge", "kept_proof", "load_sentences", "proof_key",
           "prove_int8_gpt", "proven"]

# raw-logit bound per int8 method (tests/engines/test_int8_proof.py states each one's reason and measurement)
BOUNDS = {"weight-only": 0.15, "dynamic": 0.25, "onnx-dynamic": 0.2}
PROOF_STEPS = 48  # tokens fp32 decodes per sentence at most (about 2 s of speech)
REPETITION_PENALTY = SamplingParams().repetition_penalty  # upstream's default: the paths a user's requests take
SENTENCES = Path(__file__).with_name("gpt_sovits") / "proof_sentences.json"
KEPT_SCHEMA = 1  # the kept verdict's format


class GptDecoder(Protocol):
    """The decoder surface the proof drives (the torch GPT and the graph GPT both have it)."""

    def setup_caches(self, max_slots: int, max_len: int) -> None: ...
    def prefill(self, slot: int, phones: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor: ...
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | None = None,
                    kv_len: int = 0) -> torch.Tensor: ...


@dataclass(frozen=True)
class GptProof:
    """One int8 GPT's verdict on one model.

    Attributes
    ----------
    method: ``weight-only`` (the fused step's), ``dynamic`` (torch's fbgemm) or ``onnx-dynamic`` (the ONNX step graph).
    bound: the raw-logit bound it was held to.
    max_error: the largest raw-logit difference from fp32 over every compared step.
    passed: within the bound with the stop kept.
    reason: why it failed, one line ("" when it passed).
    sentences: sentences read; steps: logit rows compared over all of them; stops: sentences fp32 ended by EOS.
    seconds: how long the proof took (informative only).
    """

    method: str
    bound: float
    max_error: float
    passed: bool
    reason: str = ""
    sentences: int = 0
    steps: int = 0
    stops: int = 0
    seconds: float = 0.0


def load_sentences(path: Path = SENTENCES) -> list[tuple[str, torch.Tensor]]:
    """The built-in sentences as (language, ``[T]`` int64 phone ids)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [(str(s["lang"]), torch.tensor([int(i) for i in s["phones"]], dtype=torch.long)) for s in data["sentences"]]


def _penalised(raw: np.ndarray, history: Sequence[int], step: int) -> np.ndarray:
    """Upstream's greedy view of one step's ``[V]`` logits: the repetition penalty on the tokens so far, and EOS cut
    (-inf) before step :data:`MIN_STEPS_BEFORE_EOS`."""
    x = raw.astype(np.float64)
    seen = np.unique(np.asarray(history, np.int64))
    x[seen] = np.where(x[seen] < 0, x[seen] * REPETITION_PENALTY, x[seen] / REPETITION_PENALTY)
    if step < MIN_STEPS_BEFORE_EOS:
        x[EOS_TOKEN] = -np.inf
    return x


def judge(fp32: np.ndarray, int8: np.ndarray, path: Sequence[int], stopped: bool, bound: float) -> tuple[float, str]:
    """One sentence's verdict: (the largest raw-logit error, "" or why it fails).

    Parameters
    ----------
    fp32, int8: ``[n, V]`` raw logits; row ``j`` after ``j`` tokens of ``path`` were fed.
    path: fp32's greedy tokens (``n`` of them, or ``n - 1`` when it stopped: its last row chose EOS).
    stopped: fp32 chose EOS at its last row (else the window ended there).
    bound: the method's raw-logit bound.
    """
    diff = np.abs(int8.astype(np.float64) - fp32.astype(np.float64))
    error = float(diff.max())
    if error > bound:
        return error, f"logit error {error:.3f} > {bound:.2f} at step {int(diff.max(axis=1).argmax())}"
    for j in range(MIN_STEPS_BEFORE_EOS, len(fp32)):
        x32, x8 = _penalised(fp32[j], path[:j], j), _penalised(int8[j], path[:j], j)
        if stopped and j == len(fp32) - 1:
            behind = float(x8.max() - x8[EOS_TOKEN])
            if behind > bound:
                return error, f"at fp32's stop (step {j}) EOS trails int8's best by {behind:.3f} > {bound:.2f}"
        elif float(x32[path[j]] - x32[EOS_TOKEN]) > bound and int(x8.argmax()) == EOS_TOKEN:
            return error, (f"EOS wins at step {j}, before fp32's stop, where fp32's choice led it by "
                           f"{float(x32[path[j]] - x32[EOS_TOKEN]):.3f}")
    return error, ""


def _decode(gpt: GptDecoder, phones: list[torch.Tensor], paths: list[list[int]] | None,
            lengths: list[int] | None, steps: int) -> tuple[list[np.ndarray], list[list[int]], list[bool]]:
    """Every sentence as a row of one batch: greedily (``paths`` None), else fed ``paths`` for ``lengths`` rows each.
    Returns each sentence's ``[n, V]`` logits, its tokens and whether it chose EOS."""
    b = len(phones)
    kv_len = -(-(max(len(p) for p in phones) + steps + 1) // KV_BUCKET) * KV_BUCKET
    gpt.setup_caches(b, kv_len)
    none = torch.zeros(0, dtype=torch.long)
    rows = [[gpt.prefill(i, p, torch.zeros(BERT_DIM, len(p)), none).reshape(-1).float()] for i, p in enumerate(phones)]
    greedy = paths is None
    tokens: list[list[int]] = [[] for _ in phones] if paths is None else paths
    stopped = [False] * b
    live = [True] * b
    for s in range(steps):
        for i in range(b):
            if greedy and live[i]:
                choice = int(_penalised(rows[i][s].numpy(), tokens[i], s).argmax())
                stopped[i] = choice == EOS_TOKEN
                if not stopped[i]:
                    tokens[i].append(choice)
                live[i] = not stopped[i] and len(tokens[i]) < steps
            elif not greedy:
                live[i] = lengths is not None and s + 1 < lengths[i]
        if not any(live):
            break
        fed = torch.tensor([tokens[i][s] if live[i] else 0 for i in range(b)])  # finished rows: ignored
        out = gpt.decode_step(fed, torch.tensor([len(p) + s for p in phones]), None, kv_len).float()
        for i in range(b):
            if live[i]:
                rows[i].append(out[i])
    return [torch.stack(r).numpy() for r in rows], tokens, stopped


@torch.inference_mode()
def prove_int8_gpt(fp32: GptDecoder, int8: GptDecoder, method: str, steps: int = PROOF_STEPS,
                   sentences: list[tuple[str, torch.Tensor]] | None = None) -> GptProof:
    """Hold ``int8`` to ``fp32`` on the built-in sentences (see the module notes); ``method`` picks the bound."""
    t0 = time.perf_counter()
    bound = BOUNDS[method]
    langs, phones = zip(*(sentences or load_sentences()))
    ref, paths, stopped = _decode(fp32, list(phones), None, None, steps)
    # each sentence alone: dynamic int8 rounds a batch's activations on one scale, and the bounds hold for one row
    got = [_decode(int8, [p], [path], [len(r)], steps)[0][0] for p, path, r in zip(phones, paths, ref)]
    error, reason = 0.0, ""
    for lang, r, g, path, stop in zip(langs, ref, got, paths, stopped):
        e, why = judge(r, g, path, stop, bound)
        error = max(error, e)
        if why and not reason:
            reason = f"{lang}: {why}"
    return GptProof(method, bound, error, not reason, reason, len(ref), sum(len(r) for r in ref), sum(stopped),
                    time.perf_counter() - t0)


def proof_key(gpt_path: Path, method: str, kernels: str = "") -> str:
    """What a kept verdict holds for: the GPT file (name, size, modification time), the method and its bound, the
    int8 kernels (``kernels``: a library other than the method's usual one) and their versions, the sentences and the
    window."""
    digest = hashlib.sha256()
    st = gpt_path.stat()
    digest.update(f"{gpt_path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    runtime = torch.__version__
    if method == "onnx-dynamic":
        import onnxruntime

        runtime += f"|ort {onnxruntime.__version__}"
    digest.update(SENTENCES.read_bytes())
    digest.update(f"{method}|{BOUNDS[method]}|{runtime}|{PROOF_STEPS}|{REPETITION_PENALTY}|{KEPT_SCHEMA}".encode())
    if kernels:
        digest.update(f"|{kernels}".encode())
    return digest.hexdigest()[:16]


def _record(folder: Path, key: str) -> Path:
    return folder / f"gpt-int8-{key}.json"


def kept_proof(folder: Path | None, gpt_path: Path, method: str, kernels: str = "") -> GptProof | None:
    """The verdict kept in ``folder`` for this GPT file, method and kernels, or None (none kept, unreadable, or
    stale)."""
    if folder is None:
        return None
    key = proof_key(gpt_path, method, kernels)
    try:
        data = json.loads(_record(folder, key).read_text())
        if data.get("schema") != KEPT_SCHEMA or data.get("key") != key:
            return None
        return GptProof(**{k: data[k] for k in GptProof.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep(folder: Path, key: str, proof: GptProof) -> None:
    """Write the verdict whole or not at all (temp file + rename); a folder that cannot be written is logged."""
    record = _record(folder, key)
    tmp = record.with_suffix(".tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"schema": KEPT_SCHEMA, "key": key, **asdict(proof)}))
        os.replace(tmp, record)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        log.warning("could not keep the int8 GPT's proof in %s (%s): it runs again at the next start", folder, e)


def proven(gpt_path: Path, method: str, folder: Path | None, prove: Callable[[], GptProof],
           kernels: str = "") -> GptProof:
    """The int8 GPT's verdict on the model at ``gpt_path``: kept in ``folder`` (None: nothing kept), else measured
    by ``prove`` (once, then kept); logged in one line either way."""
    proof = kept_proof(folder, gpt_path, method, kernels)
    fresh = proof is None
    if proof is None:
        log.info("proving the int8 GPT on this model (once)...")
        proof = prove()
        if folder is not None:
            _keep(folder, proof_key(gpt_path, method, kernels), proof)
    how = "" if fresh else " (kept)"
    method = f"{method}, {kernels}" if kernels else method
    if proof.passed:
        log.info("int8 GPT (%s): logits within %.3f of fp32's on %d built-in sentences, the stop kept (bound %.2f)%s",
                 method, proof.max_error, proof.sentences, proof.bound, how)
    else:
        log.warning("the int8 GPT (%s) misses its proof on this model (logits up to %.3f from fp32's, bound %.2f; %s)%s: "
                    "the GPT runs in fp32", method, proof.max_error, proof.bound, proof.reason, how)
    return proof
