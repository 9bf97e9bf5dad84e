"""HuBERT (chinese-hubert-base) features of a reference clip, for the prompt's semantic tokens (section 3(a)).

The model is ``transformers.HubertModel`` loaded offline from a folder in the Hugging Face layout. Upstream feeds it
the **raw** 16 kHz waveform (no feature-extractor normalisation) with **0.6 s of zeros appended**; this module appends
those zeros itself, so callers pass the clip exactly as decoded and resampled.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from engines.base import SSL_SAMPLE_RATE, EngineError

log = logging.getLogger(__name__)

__all__ = ["HubertEncoder", "REFERENCE_PAD_SAMPLES"]

# Upstream appends int(32000 * 0.3) zeros (the SoVITS rate times 0.3 s) to the *16 kHz* clip: 0.6 s of silence.
REFERENCE_PAD_SAMPLES = 9600  # samples @ 16 kHz
SSL_DIM = 768  # HuBERT hidden size the SoVITS ssl_proj expects
SSL_HOP = 320  # samples @ 16 kHz per output frame (50 Hz)
SSL_WINDOW = 400  # samples @ 16 kHz of the first output frame's receptive field
DOWNLOAD_HINT = "run `python -m bot models download`"


class HubertEncoder:
    """chinese-hubert-base wrapper: 16 kHz waveform -> ``[1, 768, T50]`` features.

    Parameters
    ----------
    model:
        a loaded ``transformers.HubertModel`` in eval mode on its device.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype

    @classmethod
    def from_folder(
        cls, path: str | os.PathLike[str], device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> HubertEncoder:
        """Load ``config.json`` + weights (``pytorch_model.bin`` or ``model.safetensors``) offline.

        Raises
        ------
        EngineError
            the folder is missing or incomplete, or is not a 768-wide HuBERT.
        """
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise EngineError(f"HuBERT model folder {folder} is missing or has no config.json; {DOWNLOAD_HINT}.")
        from transformers import HubertModel  # imported here: transformers is slow to import

        try:
            # (from_pretrained's type information is incomplete: the model is used as Any)
            model = cast(Any, HubertModel.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
                str(folder), local_files_only=True, dtype=dtype))
        except (OSError, ValueError, RuntimeError) as e:
            raise EngineError(f"HuBERT model in {folder} cannot be loaded ({e}); {DOWNLOAD_HINT}.") from e
        if model.config.hidden_size != SSL_DIM:
            raise EngineError(
                f"HuBERT in {folder} has hidden size {model.config.hidden_size}, SoVITS needs {SSL_DIM}; "
                "use chinese-hubert-base."
            )
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info("HuBERT loaded from %s (%d layers, %s %s)", folder, model.config.num_hidden_layers, device, dtype)
        return cls(model)

    @staticmethod
    def frames(n_samples: int) -> int:
        """Output frames for a clip of ``n_samples`` @ 16 kHz (the 0.6 s pad included)."""
        n = n_samples + REFERENCE_PAD_SAMPLES
        return (n - SSL_WINDOW) // SSL_HOP + 1

    def encode(self, wav16k: np.ndarray | Tensor) -> Tensor:
        """HuBERT ``last_hidden_state`` of a reference clip, with upstream's 0.6 s zero pad appended here.

        Parameters
        ----------
        wav16k:
            ``[N]`` float32 mono @ 16 kHz, raw (not normalised). Upstream accepts 3-10 s clips; the caller checks that.

        Returns
        -------
        Tensor
            ``[1, 768, T50]`` in the model dtype on its device, ``T50 = frames(N)``.
        """
        x = torch.as_tensor(wav16k).float().reshape(-1)
        x = torch.cat([x, x.new_zeros(REFERENCE_PAD_SAMPLES)])
        with torch.inference_mode():
            out = self.model(x.to(self.device, self.dtype).unsqueeze(0))
        return out.last_hidden_state.transpose(1, 2)

    @property
    def sample_rate(self) -> int:
        """Expected input rate (Hz)."""
        return SSL_SAMPLE_RATE
