"""The 48 kHz HiFi-GAN vocoder of v4 and v5 (upstream ``module.models.Generator`` as ``TTS.init_vocoder`` builds it;
reference section 7.1): a log-mel ``[1, 100, T]`` at 100 fps -> a waveform ``[1, 1, 480 T]`` at 48 kHz.

``conv_pre`` (k7) -> per stage: leaky ReLU 0.1, transposed conv (rates 10, 6, 2, 2, 2), the mean of three
ResBlock1 (kernels 3, 7, 11, dilations 1, 3, 5) -> leaky ReLU 0.01 -> ``conv_post`` (k7, with bias) -> tanh. The file
holds plain weights (weight norm was removed before saving); the widths are read from them.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.base import ModelFormatError
from engines.gpt_sovits.sovits_modules import FINAL_LRELU_SLOPE, LRELU_SLOPE, ResBlock1

log = logging.getLogger(__name__)

__all__ = ["Vocoder48k"]

MEL_DIM = 100
PRE_KERNEL = 7  # conv_pre and conv_post kernels
RESBLOCK_KERNELS = (3, 7, 11)  # upstream vocoder args (fixed in TTS.init_vocoder)
RESBLOCK_DILATIONS = (1, 3, 5)
UPSAMPLE_RATES = (10, 6, 2, 2, 2)  # x480: 100 fps -> 48 kHz
SAMPLE_RATE = 48000  # Hz


class Vocoder48k(nn.Module):
    """HiFi-GAN 48 kHz (inference). Build with :meth:`from_state_dict`; call under ``torch.inference_mode()``."""

    def __init__(self, channels: int, kernels: tuple[int, ...]) -> None:
        super().__init__()
        self.conv_pre = nn.Conv1d(MEL_DIM, channels, PRE_KERNEL, padding=PRE_KERNEL // 2)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = channels
        for u, k in zip(UPSAMPLE_RATES, kernels):
            self.ups.append(nn.ConvTranspose1d(ch, ch // 2, k, stride=u, padding=(k - u) // 2))
            ch //= 2
            for rk in RESBLOCK_KERNELS:
                self.resblocks.append(ResBlock1(ch, rk, RESBLOCK_DILATIONS))
        self.conv_post = nn.Conv1d(ch, 1, PRE_KERNEL, padding=PRE_KERNEL // 2)

    @property
    def hop(self) -> int:
        """Output samples per mel frame (480)."""
        n = 1
        for u in UPSAMPLE_RATES:
            n *= u
        return n

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor], device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> Vocoder48k:
        """Build from :func:`engines.gpt_sovits.dit_checkpoint.load_vocoder48k_checkpoint`'s weights.

        Raises
        ------
        ModelFormatError
            weights missing, unexpected or mis-shaped (the file is not upstream's 48 kHz vocoder).
        """
        try:
            channels = int(sd["conv_pre.weight"].shape[0])
            kernels = tuple(int(sd[f"ups.{i}.weight"].shape[-1]) for i in range(len(UPSAMPLE_RATES)))
        except KeyError as e:
            raise ModelFormatError(f"vocoder lacks {e.args[0]!r}; it is not the v4/v5 48 kHz vocoder, download "
                                   "vocoder.pth again.") from None
        model = cls(channels, kernels)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        wrong = [k for k in expected if k in sd and sd[k].shape != expected[k].shape]
        if missing or unexpected or wrong:
            raise ModelFormatError(
                f"vocoder weights do not match the 48 kHz HiFi-GAN: missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}, mis-shaped {wrong[:3]}; download vocoder.pth again."
            )
        model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info("48 kHz vocoder: %d channels, %.1f M params", channels,
                 sum(p.numel() for p in model.parameters()) / 1e6)
        return model

    def forward(self, mel: Tensor) -> Tensor:
        """Log-mel ``[B, 100, T]`` (denormalised) -> waveform ``[B, 1, 480 T]`` in (-1, 1) @ 48 kHz."""
        x = self.conv_pre(mel)
        n = len(RESBLOCK_KERNELS)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs = xs + self.resblocks[i * n + j](x)
            x = xs / n
        return torch.tanh(self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)))
