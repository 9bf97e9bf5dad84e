"""HuBERT and BERT, loaded on first use and shared by every backend (they run in torch everywhere), and the reference
encode every backend runs with them."""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Sequence

import numpy as np
import torch

from engines.base import EngineError
from engines.gpt_sovits.sovits import mean_style
from engines.gpt_sovits.spectrogram import reference_spec_input
from engines.runtime import IdleUnloaded, release_freed_memory

if TYPE_CHECKING:
    from engines.gpt_sovits.bert import BertFeaturizer
    from engines.gpt_sovits.ssl import HubertEncoder

log = logging.getLogger(__name__)

# how long an exiting process waits for the int8 BERT's proof to stop (its longest part: 4.6 s at the real size)
PROOF_JOIN_S = 10.0


class LazyEncoders:
    """The reference encoder (HuBERT) and the Chinese text encoder (BERT), each loaded the first time it is used.

    Voices are prepared once and most text is not Chinese, so neither needs to cost start-up time or memory; HuBERT
    is unloaded again after :data:`engines.runtime.IDLE_UNLOAD_S` without use (``hubert_model``: a quarter of a
    serving process's memory, loaded again in seconds for the next voice made; see
    FINDINGS.md#host-memory-kv-cache-freed-heap-hubert-the-kept-int8-bert).
    """

    def __init__(self, hubert_path: Path | None, bert_path: Path | None, device: str, dtype: torch.dtype) -> None:
        self._paths = {"hubert": hubert_path, "bert": bert_path}
        self._device, self._dtype = device, dtype
        # the GPT checkpoint an int8 BERT must prove itself on (engines.bert_int8): set by the int8 engines on a CPU
        self.int8_bert_for: Path | None = None
        # where the proof's outcome is kept across restarts (engines.bert_int8.keep_proof), or None: proven each start
        self.int8_bert_store: Path | None = None
        self._bert: BertFeaturizer | None = None
        self._lock = threading.Lock()
        self.bert_precision = "fp32"  # what runs: int8 once its proof held (engines.bert_int8)
        self.bert_int8_error: float | None = None  # the proof's measured logit error
        self.bert_proof: threading.Thread | None = None  # the proof, running beside the fp32 BERT until it ends
        self._stop_proof = threading.Event()
        self.hubert_model: IdleUnloaded[HubertEncoder] = IdleUnloaded(self._load_hubert, "HuBERT")

    def load(self, name: Literal["hubert", "bert"]) -> None:
        """Load one encoder now (``Engine.load_encoder``), off the device thread, before a request needs it."""
        if name == "hubert":
            self.hubert()
        else:
            self.bert()

    def hubert(self) -> HubertEncoder:
        """HuBERT, loaded if it is not (unloaded after ``hubert_model.idle_s`` unused: it runs only when a voice is
        made)."""
        return self.hubert_model.get()

    def _load_hubert(self) -> HubertEncoder:
        from engines.gpt_sovits.ssl import HubertEncoder

        return HubertEncoder.from_folder(self._path("hubert"), self._device, self._dtype)

    def bert(self) -> BertFeaturizer:
        with self._lock:
            if self._bert is None:
                from engines.gpt_sovits.bert import BertFeaturizer

                kept = self._kept_proof()
                if kept is not None and kept[0] is not None:  # proven before: the int8 BERT alone is loaded
                    self._bert, self.bert_precision, self.bert_int8_error = kept[0], "int8", kept[1]
                    log.info("int8 BERT as proven before on this model pair (the GPT's logits within %.3f of the "
                             "fp32 BERT's), kept in %s", kept[1], self.int8_bert_store)
                    return self._bert
                self._bert = BertFeaturizer.from_folder(self._path("bert"), self._device, self._dtype)
                release_freed_memory()  # (loading's own buffers: 0.3 GB at the real size)
                if kept is not None:  # proven before to miss the bound: the fp32 BERT stays, no proof again
                    self.bert_int8_error = kept[1]
                elif self.int8_bert_for is not None:
                    # the fp32 BERT serves at once; the int8 one replaces it when it has proven itself (quantising
                    # it and the proof take seconds of one core: the first Chinese sentence does not wait for them)
                    self.bert_proof = threading.Thread(target=self._prove_int8_bert, name="voicebot-bert-int8",
                                                       daemon=True)
                    atexit.register(self.stop_background)
                    self.bert_proof.start()
            return self._bert

    def stop_background(self, timeout_s: float = PROOF_JOIN_S) -> None:
        """Stop the int8 BERT's proof if it runs and wait for it (at most ``timeout_s``); the fp32 BERT stays.
        Called at interpreter exit: a daemon thread still inside torch when Python finalises may crash the exit."""
        self._stop_proof.set()
        proof = self.bert_proof
        if proof is not None and proof is not threading.current_thread():
            proof.join(timeout_s)
        atexit.unregister(self.stop_background)

    def _prove_int8_bert(self) -> None:
        """The proof's thread: the int8 BERT replaces the fp32 one if it holds; then the memory that the fp32 BERT,
        the candidates and the proof's GPT held goes back to the OS (two thirds of the process's memory after the
        proof: see FINDINGS.md#freed-heap)."""
        self._prove_against_fp32()
        release_freed_memory()  # (the fp32 BERT is freed once the sentence that may still read it ends)

    def _prove_against_fp32(self) -> None:
        from engines.bert_int8 import ProofStopped, prove_int8_bert

        assert self.int8_bert_for is not None
        bert = self._bert
        assert bert is not None
        try:
            proven, self.bert_int8_error = prove_int8_bert(bert, self.int8_bert_for, self._stop_proof.is_set)
        except ProofStopped:
            log.info("the int8 BERT's proof stopped before it ended (shutting down); the fp32 BERT stays")
            return
        except Exception:  # (the fp32 BERT simply stays)
            log.exception("the int8 BERT could not be made or proven; the fp32 BERT runs")
            return
        finally:
            atexit.unregister(self.stop_background)  # (ended: nothing to stop at exit)
        if proven is not bert:
            with self._lock:
                self._bert, self.bert_precision = proven, "int8"
        if self.int8_bert_store is not None:
            from engines.bert_int8 import keep_proof, proof_key

            try:
                keep_proof(self.int8_bert_store, proof_key(self._path("bert")), None if proven is bert else proven,
                           self.bert_int8_error)
            except OSError as e:  # (a full or read-only disk: the next start proves it again)
                log.warning("the int8 BERT's proof could not be kept in %s (%s)", self.int8_bert_store, e)

    def _kept_proof(self) -> tuple[BertFeaturizer | None, float] | None:
        """(Under the lock) the outcome of a proof kept for this BERT (:func:`engines.bert_int8.kept_proof`)."""
        if self.int8_bert_for is None or self.int8_bert_store is None:
            return None
        from engines.bert_int8 import kept_proof, proof_key

        return kept_proof(self.int8_bert_store, proof_key(self._path("bert")), self._path("bert"))

    def _path(self, name: str) -> Path:
        path = self._paths[name]
        if path is None:
            raise EngineError(f"no {name.upper()} model configured (models.{name} in config.yaml)")
        return path


def encode_reference(encoders: LazyEncoders, wav16k: np.ndarray | None, refs32k: Sequence[np.ndarray], *,
                     extract_latent: Callable[[torch.Tensor], torch.Tensor],
                     ref_style: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
                     svs: Sequence[torch.Tensor | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A reference clip -> (prompt tokens, ge), the steps of ``Engine.encode_reference`` for every backend.

    HuBERT features of ``wav16k`` (``[1, 768, T50]``; skipped when None: reference-free) go through the backend's
    ``extract_latent`` (its SoVITS quantizer, ``-> [1, 1, T25]`` codes); each 32 kHz clip's linear spectrogram
    (``[1, 1025, frames]``) through its ``ref_style`` with that clip's speaker features (``svs[i]``, v2Pro; else
    None), and the styles are averaged.

    Returns
    -------
    ``[T25]`` int64 prompt tokens (empty when reference-free) and ``ge`` ``[gin, 1]`` float32.
    """
    if not refs32k:
        raise EngineError("encode_reference needs at least one 32 kHz reference clip")
    tokens = np.zeros(0, np.int64)
    if wav16k is not None:
        ssl = encoders.hubert().encode(wav16k)  # [1, 768, T50]
        tokens = extract_latent(ssl)[0, 0].cpu().numpy().astype(np.int64)
    rows: Sequence[torch.Tensor | None] = svs if svs is not None else [None] * len(refs32k)
    ges = [ref_style(reference_spec_input(np.asarray(wav, np.float32)), sv) for wav, sv in zip(refs32k, rows)]
    return tokens, mean_style(ges)[0].float().cpu().numpy()  # mean over the clips: [1, gin, 1] -> [gin, 1]
