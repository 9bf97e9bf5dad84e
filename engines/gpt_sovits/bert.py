"""Chinese BERT features for the GPT (chinese-roberta-wwm-ext-large; upstream reference section 2, "BERT").

Upstream runs ``AutoModelForMaskedLM`` with all hidden states and keeps ``hidden_states[-3]`` (the output of the
third-to-last encoder layer). That tensor does not depend on the last two layers or the MLM head, so this module
keeps only the masked-LM model's base ``BertModel`` and drops its last two layers: the same numbers, less work.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence, cast

import numpy as np
import torch

from engines.base import BERT_DIM, EngineError

log = logging.getLogger(__name__)

__all__ = ["BertFeaturizer"]

HIDDEN_STATE_FROM_END = 3  # upstream keeps hidden_states[-3]
DOWNLOAD_HINT = "run `python -m bot models download`"


class BertFeaturizer:
    """Per-phone BERT features of normalised Chinese text.

    Parameters
    ----------
    tokenizer:
        the folder's tokenizer (one token per Chinese character).
    model:
        a ``BertModel`` already truncated so that its last hidden state is upstream's ``hidden_states[-3]``.
    """

    def __init__(self, tokenizer: Any, model: torch.nn.Module) -> None:
        self.tokenizer = tokenizer
        self.model = model
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype

    @classmethod
    def from_folder(
        cls, path: str | os.PathLike[str], device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> BertFeaturizer:
        """Load the tokenizer and the encoder offline from a Hugging Face layout folder.

        Raises
        ------
        EngineError
            the folder is missing or incomplete, or the model is not 1024 wide with at least 2 layers.
        """
        return cls._load(path, device, dtype, weights=True)

    @classmethod
    def skeleton(cls, path: str | os.PathLike[str]) -> BertFeaturizer:
        """The folder's tokenizer and its truncated ``BertModel`` (CPU, fp32) without reading its weights: the
        parameters are left uninitialised (no memory is committed until they are written), for weights kept elsewhere
        (:mod:`engines.bert_int8`'s kept int8 BERT). Raises as :meth:`from_folder`."""
        return cls._load(path, "cpu", torch.float32, weights=False)

    @classmethod
    def _load(cls, path: str | os.PathLike[str], device: str | torch.device, dtype: torch.dtype,
              weights: bool) -> BertFeaturizer:
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise EngineError(f"BERT model folder {folder} is missing or has no config.json; {DOWNLOAD_HINT}.")
        from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer  # imported here: slow to import

        # (the Auto classes' from_pretrained is untyped: the tokenizer and the BertModel are used as Any)
        try:
            tokenizer = cast(Any, AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
                str(folder), local_files_only=True))
            if weights:
                model = cast(Any, AutoModelForMaskedLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
                    str(folder), local_files_only=True, dtype=dtype)).base_model
            else:
                config = cast(Any, AutoConfig.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
                    str(folder), local_files_only=True))
                with _no_init_weights():  # (in the dtype asked: a conversion would write every page)
                    model = cast(Any, AutoModelForMaskedLM.from_config(  # pyright: ignore[reportUnknownMemberType]
                        config, dtype=dtype)).base_model
        except (OSError, ValueError, RuntimeError) as e:
            raise EngineError(f"BERT model in {folder} cannot be loaded ({e}); {DOWNLOAD_HINT}.") from e
        n_layers = len(model.encoder.layer)
        if model.config.hidden_size != BERT_DIM or n_layers < HIDDEN_STATE_FROM_END - 1:
            raise EngineError(
                f"BERT in {folder} has hidden size {model.config.hidden_size} and {n_layers} layers; the GPT needs "
                f"{BERT_DIM} wide and at least {HIDDEN_STATE_FROM_END - 1} layers (chinese-roberta-wwm-ext-large)."
            )
        # hidden_states[-3] of the full model == the output after the first n_layers - 2 layers
        model.encoder.layer = model.encoder.layer[: n_layers - (HIDDEN_STATE_FROM_END - 1)]
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if weights:
            log.info("BERT loaded from %s (%d of %d layers used, %s %s)", folder, n_layers - 2, n_layers, device,
                     dtype)
        return cls(tokenizer, model)

    def features(self, norm_text: str, word2ph: Sequence[int]) -> np.ndarray:
        """BERT features repeated per phone.

        Parameters
        ----------
        norm_text:
            normalised Chinese text (the zh G2P's ``norm_text``): one character per ``word2ph`` entry.
        word2ph:
            phones per character (2 per hanzi, 1 per punctuation mark).

        Returns
        -------
        np.ndarray
            ``[1024, sum(word2ph)]`` float32: row ``i`` of ``hidden_states[-3]`` (CLS/SEP dropped) repeated
            ``word2ph[i]`` times, transposed.

        Raises
        ------
        EngineError
            the tokenizer did not give one token per character of ``norm_text`` (the text was not normalised).
        """
        counts = torch.as_tensor(list(word2ph), dtype=torch.long)
        if len(norm_text) != len(counts):
            raise EngineError(f"word2ph has {len(counts)} entries for {len(norm_text)} characters of {norm_text!r}")
        enc = self.tokenizer(norm_text, return_tensors="pt")
        n_tokens = int(enc["input_ids"].shape[1]) - 2
        if n_tokens != len(counts):
            raise EngineError(
                f"the BERT tokenizer split {norm_text!r} into {n_tokens} tokens, not one per character; "
                "pass the zh front-end's normalised text"
            )
        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in enc.items()})
            hidden = out.last_hidden_state[0, 1:-1].float()  # [chars, 1024]
            per_phone = torch.repeat_interleave(hidden, counts.to(hidden.device), dim=0)  # [phones, 1024]
        return per_phone.t().contiguous().cpu().numpy()


def _no_init_weights() -> Any:
    """transformers' context that skips the random initialisation of new models' weights (moved between versions)."""
    try:
        from transformers.initialization import no_init_weights  # pyright: ignore[reportMissingImports, reportUnknownVariableType]
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights  # pyright: ignore[reportUnknownVariableType, reportAttributeAccessIssue]
    return no_init_weights()  # pyright: ignore[reportUnknownVariableType]
