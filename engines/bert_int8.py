"""An int8 Chinese BERT for CPUs (with the int8 GPT, ``engine.precision: int8``, which ``auto`` picks on a CPU), proven
on the loaded models before it replaces the fp32 one.

Why: the BERT (chinese-roberta-wwm-ext-large, 22 of its 24 layers used, 277 M weights in its linears) runs once per
Chinese sentence before its GPT, so its time adds to the first audio and to every Chinese sentence. Its linears in
dynamic int8 (:func:`~engines.gpt_sovits.dynamic_int8`: int8 weights per output channel, activations rounded per call
to uint8, fbgemm's kernels) take a quarter to a third of fp32's time on a 2-core CPU (see
FINDINGS.md#chinese-bert-int8-proof).

The proof, per model pair: the fp32 GPT of the loaded checkpoint (reference-free) reads :data:`PROOF_TEXTS` with the
fp32 BERT's features and then with the int8 one's, at its first token and :data:`PROOF_STEPS` steps along its own
greedy path (teacher-forced), and the int8 features may move no logit by more than :data:`MAX_LOGIT_ERROR`, the
bound the int8 GPT itself is held to against upstream. Random weights at the real size pass it narrowly; a trained
BERT's activations may have outliers that rounding per call handles worse, which is why the proof runs on the loaded
model; a model that misses the bound tries the BERT with its feed-forward down projections in fp32
(:data:`CANDIDATES`), then keeps the fp32 BERT. Quantising the BERT and the
proof take about 7 s of one core a candidate (real size), in the background after the fp32 BERT loaded
(:class:`~engines.encoders.LazyEncoders`), which serves until then.

The outcome is kept (:func:`keep_proof`, the onnx engine keeps it in its export folder of the model pair): the int8
BERT's weights and the measured error, or that the fp32 BERT stays. A later start loads the kept int8 BERT directly
(:func:`kept_proof`): no fp32 BERT is read and no proof runs again, until the BERT's files, torch's version or the
bound change, so a restart never peaks with the fp32 BERT and the proof beside it (see
FINDINGS.md#chinese-bert-int8-proof).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np
import torch

from engines.gpt_sovits import dynamic_int8
from engines.runtime import set_cpu_threads

log = logging.getLogger(__name__)

__all__ = ["CANDIDATES", "MAX_LOGIT_ERROR", "PROOF_TEXTS", "ProofStopped", "bert_int8_logit_error", "int8_bert",
           "keep_proof", "kept_proof", "proof_key", "prove_int8_bert"]

MAX_LOGIT_ERROR = 0.15  # the int8 GPT's bound against upstream's logits (tests/engines/test_int8_proof.py)
PROOF_TEXTS = ("今天天气很好，我们去公园散步吧。", "请把窗户关上，外面的风太大了。", "这本书讲的是一个很长很长的故事。")
PROOF_STEPS = 16  # greedy steps after the first token, teacher-forced
PROOF_SEED = 0  # the proof's phone ids (any: the BERT features are what differs between the two runs)
KEPT_SCHEMA = 1  # the kept outcome's format (keep_proof)

if TYPE_CHECKING:
    from engines.gpt_sovits.bert import BertFeaturizer
    from engines.gpt_sovits.gpt import Text2SemanticModel


class ProofStopped(Exception):
    """The proof was asked to stop (the process is exiting) before it ended; the fp32 BERT stays."""


def _ffn_down(name: str) -> bool:
    """A layer's feed-forward down projection (``encoder.layer.N.output.dense``, not the attention's output)."""
    return name.endswith(".output.dense") and ".attention." not in name


# what is tried, in order, until one holds: every linear in int8; then all but the feed-forward down projections
# (their inputs, after the GELU, round worst: see FINDINGS.md#chinese-bert-int8-proof)
CANDIDATES: tuple[tuple[str, Callable[[str], bool] | None], ...] = (
    ("every linear", None), ("all but the feed-forward down projections", _ffn_down))


def int8_bert(bert: BertFeaturizer, keep: Callable[[str], bool] | None = None) -> BertFeaturizer:
    """A copy of ``bert`` (on the CPU) with its linear layers in dynamic int8 (those ``keep`` accepts stay fp32)."""
    from engines.gpt_sovits.bert import BertFeaturizer

    return BertFeaturizer(bert.tokenizer, dynamic_int8(bert.model, keep))


class _Reference(NamedTuple):
    """One proof sentence read with the fp32 BERT's features: its characters, phones, greedy path and logits."""

    text: str
    phones: torch.Tensor  # [2 * chars] int64
    path: list[int]  # the greedy tokens the int8 runs are fed
    logits: torch.Tensor  # [PROOF_STEPS + 1, vocab]


def _load_gpt(gpt_path: Path) -> Text2SemanticModel:
    from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
    from engines.gpt_sovits.gpt import Text2SemanticModel

    return Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(gpt_path))


def _read(gpt: Text2SemanticModel, bert: BertFeaturizer, text: str, phones: torch.Tensor,
          path: list[int]) -> torch.Tensor:
    """The GPT's logits (reference-free) at its first token and after each of ``path``'s tokens, with ``bert``'s
    features of ``text``; ``path`` is extended by the greedy choices while shorter than :data:`PROOF_STEPS`."""
    from engines.gpt_sovits.gpt import KV_BUCKET

    feats = torch.as_tensor(bert.features(text, [2] * len(text)))
    kv_len = -(-(len(phones) + PROOF_STEPS + 1) // KV_BUCKET) * KV_BUCKET
    gpt.setup_caches(1, kv_len)
    rows = [gpt.prefill(0, phones, feats, torch.zeros(0, dtype=torch.long)).reshape(-1)]
    for i in range(PROOF_STEPS):
        if len(path) < PROOF_STEPS:
            path.append(int(rows[-1].argmax()))
        rows.append(gpt.decode_step(torch.tensor([path[i]]), torch.tensor([len(phones) + i]), None, kv_len)[0])
    return torch.stack(rows)


def _never() -> bool:
    return False


def _check(stop: Callable[[], bool]) -> None:
    if stop():
        raise ProofStopped("the int8 BERT's proof was stopped before it ended")


@torch.inference_mode()
def _reference(gpt: Text2SemanticModel, fp32: BertFeaturizer, stop: Callable[[], bool] = _never) -> list[_Reference]:
    """:data:`PROOF_TEXTS` read with the fp32 BERT (2 phones a character: the phones need not be the text's)."""
    rng = np.random.default_rng(PROOF_SEED)
    out: list[_Reference] = []
    for text in PROOF_TEXTS:
        _check(stop)
        phones = torch.as_tensor(rng.integers(1, gpt.config.phoneme_vocab, 2 * len(text)), dtype=torch.long)
        path: list[int] = []
        logits = _read(gpt, fp32, text, phones, path)
        out.append(_Reference(text, phones, path, logits))
    return out


@torch.inference_mode()
def _logit_error(gpt: Text2SemanticModel, int8: BertFeaturizer, reference: list[_Reference],
                 stop: Callable[[], bool] = _never) -> float:
    error = 0.0
    for r in reference:
        _check(stop)
        error = max(error, float((_read(gpt, int8, r.text, r.phones, r.path) - r.logits).abs().max()))
    return error


def bert_int8_logit_error(fp32: BertFeaturizer, int8: BertFeaturizer, gpt_path: Path) -> float:
    """The largest logit difference of the fp32 GPT at ``gpt_path`` between the two BERTs' features on
    :data:`PROOF_TEXTS` (see the module notes)."""
    gpt = _load_gpt(gpt_path)
    return _logit_error(gpt, int8, _reference(gpt, fp32))


def prove_int8_bert(bert: BertFeaturizer, gpt_path: Path,
                    stop: Callable[[], bool] = _never) -> tuple[BertFeaturizer, float]:
    """The first int8 copy of ``bert`` (:data:`CANDIDATES`) whose proof holds on the GPT at ``gpt_path``, else
    ``bert`` itself (logged); and the last measured logit error. Runs on the calling thread alone (one torch thread:
    see engines.loader). ``stop`` is asked between the proof's parts (a second or so of work each, quantising a
    candidate up to 4.6 s at the real size); once it says True the proof raises :class:`ProofStopped`."""
    set_cpu_threads(1)
    gpt = _load_gpt(gpt_path)
    reference = _reference(gpt, bert, stop)  # (read once for every candidate)
    error = float("inf")
    for label, keep in CANDIDATES:
        _check(stop)
        candidate = int8_bert(bert, keep)
        error = _logit_error(gpt, candidate, reference, stop)
        if error <= MAX_LOGIT_ERROR:
            log.info("int8 BERT (%s): the GPT's logits within %.3f of the fp32 BERT's on this model (bound %.2f)",
                     label, error, MAX_LOGIT_ERROR)
            return candidate, error
        log.info("int8 BERT (%s): the GPT's logits moved by %.3f on this model (bound %.2f)", label, error,
                 MAX_LOGIT_ERROR)
    log.warning("no int8 BERT kept the GPT's logits within %.2f on this model (the last moved them by %.3f): the fp32 "
                "BERT runs", MAX_LOGIT_ERROR, error)
    return bert, error


def proof_key(bert_folder: Path) -> str:
    """What a kept outcome is valid for, besides the GPT (whose export folder keeps it): the BERT folder's files
    (names, sizes, modification times), torch's version (its int8 weight format), the bound and the candidates."""
    digest = hashlib.sha256()
    for f in sorted(p for p in Path(bert_folder).iterdir() if p.is_file()):
        st = f.stat()
        digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    digest.update(f"{torch.__version__}|{MAX_LOGIT_ERROR}|{[label for label, _ in CANDIDATES]}|{KEPT_SCHEMA}".encode())
    return digest.hexdigest()[:16]


def keep_proof(store: Path, key: str, proven: BertFeaturizer | None, error: float) -> None:
    """Keep a proof's outcome: ``<store>.json`` (the key, the error, the precision that runs) and, where an int8 BERT
    held (``proven``; None: the fp32 BERT stays), its weights in ``<store>.pt``. Each file is written whole or not at
    all; the JSON last, so a crash leaves no record of weights that are not all there."""
    store.parent.mkdir(parents=True, exist_ok=True)
    weights, record = store.with_suffix(".pt"), store.with_suffix(".json")
    record.unlink(missing_ok=True)
    tmp = weights.with_suffix(".pt.tmp")
    try:
        if proven is not None:
            torch.save(proven.model.state_dict(), tmp)
            os.replace(tmp, weights)
        else:
            weights.unlink(missing_ok=True)
        tmp = record.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"schema": KEPT_SCHEMA, "key": key, "error": error, "bound": MAX_LOGIT_ERROR,
                                   "precision": "int8" if proven is not None else "fp32"}))
        os.replace(tmp, record)
    finally:
        tmp.unlink(missing_ok=True)  # (a full disk: no half file left behind)


def kept_proof(store: Path, key: str, bert_folder: Path) -> tuple[BertFeaturizer | None, float] | None:
    """The outcome :func:`keep_proof` kept for ``key``: (the int8 BERT, loaded, or None where the fp32 BERT stays;
    the error measured), or None where nothing valid is kept (then the proof runs again)."""
    record = store.with_suffix(".json")
    try:
        kept = json.loads(record.read_text())
        if kept.get("schema") != KEPT_SCHEMA or kept.get("key") != key:
            return None
        error = float(kept["error"])
        if kept["precision"] == "fp32":
            return None, error
        with warnings.catch_warnings():  # (torch's loader of int8 tensors calls its own deprecated functions)
            warnings.simplefilter("ignore", UserWarning)
            # mapped, not read: the fp32 tensors stay pages of the file (assigned, not copied), the int8 ones are
            # packed from it
            state = torch.load(store.with_suffix(".pt"), map_location="cpu", weights_only=True, mmap=True)
            return _int8_from_state(bert_folder, state), error
    except FileNotFoundError:
        return None
    except Exception as e:  # unreadable, truncated or of another layout: prove again (and keep the new outcome)
        log.warning("the kept int8 BERT in %s cannot be used (%s): proving it again", store.parent, e)
        return None


def _int8_from_state(bert_folder: Path, state: dict[str, torch.Tensor]) -> BertFeaturizer:
    """The folder's BERT with the kept int8 state: its skeleton, each linear the state holds in int8 swapped for a
    dynamic int8 one, then every weight from the state (strict: a mismatch raises)."""
    from engines.gpt_sovits.bert import BertFeaturizer

    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    featurizer = BertFeaturizer.skeleton(bert_folder)
    model = featurizer.model
    modules: list[tuple[str, torch.nn.Module]] = list(model.named_modules())  # pyright: ignore[reportUnknownArgumentType]
    for name, module in modules:
        children: list[tuple[str, torch.nn.Module]] = list(module.named_children())  # pyright: ignore[reportUnknownArgumentType]
        for child_name, child in children:
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, torch.nn.Linear) and f"{full}._packed_params._packed_params" in state:
                setattr(module, child_name, DynamicInt8Linear(child.in_features, child.out_features, dtype=torch.qint8))
    model.load_state_dict(state, strict=True, assign=True)
    return BertFeaturizer(featurizer.tokenizer, model.eval().requires_grad_(False))
