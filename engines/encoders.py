"""HuBERT and BERT, loaded on first use and shared by every backend (they run in torch everywhere)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engines.base import EngineError

if TYPE_CHECKING:
    from engines.gpt_sovits.bert import BertFeaturizer
    from engines.gpt_sovits.ssl import HubertEncoder


class LazyEncoders:
    """The reference encoder (HuBERT) and the Chinese text encoder (BERT), each loaded the first time it is used.

    Voices are prepared once and most text is not Chinese, so neither needs to cost start-up time or memory.
    """

    def __init__(self, hubert_path: Path | None, bert_path: Path | None, device: str, dtype: torch.dtype) -> None:
        self._paths = {"hubert": hubert_path, "bert": bert_path}
        self._device, self._dtype = device, dtype
        self._hubert: HubertEncoder | None = None
        self._bert: BertFeaturizer | None = None
        self._lock = threading.Lock()

    def hubert(self) -> HubertEncoder:
        with self._lock:
            if self._hubert is None:
                from engines.gpt_sovits.ssl import HubertEncoder

                self._hubert = HubertEncoder.from_folder(self._path("hubert"), self._device, self._dtype)
            return self._hubert

    def bert(self) -> BertFeaturizer:
        with self._lock:
            if self._bert is None:
                from engines.gpt_sovits.bert import BertFeaturizer

                self._bert = BertFeaturizer.from_folder(self._path("bert"), self._device, self._dtype)
            return self._bert

    def _path(self, name: str) -> Path:
        path = self._paths[name]
        if path is None:
            raise EngineError(f"no {name.upper()} model configured (models.{name} in config.yaml)")
        return path
