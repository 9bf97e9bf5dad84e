"""v3's vocoder: NVIDIA's BigVGAN v2 (24 kHz, 100 bands, 256x), as upstream loads it (``BigVGAN.from_pretrained``
then ``remove_weight_norm``; reference section 7.2): a log-mel ``[1, 100, T]`` -> a waveform ``[1, 1, 256 T]``.

``conv_pre`` (k7) -> per stage: transposed conv, the mean of AMP blocks (anti-aliased SnakeBeta around dilated convs)
-> anti-aliased SnakeBeta -> ``conv_post`` (k7) -> clamp to [-1, 1] (or tanh where the config says). The
anti-aliasing (2x up-sample, activation, 2x down-sample, kaiser-sinc filters) uses the filters stored in the file.
Sizes and options come from the folder's ``config.json``; weight norm is folded at load.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.base import ModelFormatError
from engines.gpt_sovits.dit_checkpoint import BigVGANCheckpoint, load_bigvgan_checkpoint
from engines.gpt_sovits.sovits_modules import fold_weight_norm

log = logging.getLogger(__name__)

__all__ = ["BigVGAN"]

AA_RATIO = 2  # anti-aliased activations run at twice the rate
AA_KERNEL = 12  # their filters' length
SNAKE_EPS = 1e-9  # added to beta before dividing (upstream no_div_by_zero)
POST_KERNEL = 7  # conv_pre and conv_post kernels


class _SnakeBeta(nn.Module):
    """``x + sin^2(a x) / b`` per channel (``alpha``, ``beta``; log-scale when the config says)."""

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.alpha[None, :, None], self.beta[None, :, None]
        if self.logscale:
            a, b = torch.exp(a), torch.exp(b)
        return x + (1.0 / (b + SNAKE_EPS)) * torch.sin(x * a).pow(2)


class _UpSample(nn.Module):
    """2x up-sampling by a zero-stuffing transposed conv with the stored low-pass (replicate-padded)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels  # a constant, so that an ONNX export knows the grouped filter's shape
        self.register_buffer("filter", torch.zeros(1, 1, AA_KERNEL))
        self.pad = AA_KERNEL // AA_RATIO - 1
        self.cut_left = self.pad * AA_RATIO + (AA_KERNEL - AA_RATIO) // 2
        self.cut_right = self.pad * AA_RATIO + (AA_KERNEL - AA_RATIO + 1) // 2

    filter: Tensor

    def forward(self, x: Tensor) -> Tensor:
        c = self.channels
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = AA_RATIO * F.conv_transpose1d(x, self.filter.expand(c, -1, -1), stride=AA_RATIO, groups=c)
        return x[..., self.cut_left : -self.cut_right]


class _LowPass(nn.Module):
    """The down-sampler's low-pass conv with stride 2 (replicate-padded; key ``lowpass.filter``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels  # (as in _UpSample)
        self.register_buffer("filter", torch.zeros(1, 1, AA_KERNEL))

    filter: Tensor

    def forward(self, x: Tensor) -> Tensor:
        c = self.channels
        x = F.pad(x, (AA_KERNEL // 2 - 1, AA_KERNEL // 2), mode="replicate")
        return F.conv1d(x, self.filter.expand(c, -1, -1), stride=AA_RATIO, groups=c)


class _DownSample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.lowpass = _LowPass(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.lowpass(x)


class _AntiAliased(nn.Module):
    """up-sample -> SnakeBeta -> down-sample (keys ``upsample``, ``act``, ``downsample``)."""

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.upsample = _UpSample(channels)
        self.act = _SnakeBeta(channels, logscale)
        self.downsample = _DownSample(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.downsample(self.act(self.upsample(x)))


class _AMPBlock1(nn.Module):
    """Per dilation: ``x += c2(act(c1_d(act(x))))`` with anti-aliased activations."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], logscale: bool) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel * d - d) // 2) for d in dilations)
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in dilations)
        self.activations = nn.ModuleList(_AntiAliased(channels, logscale) for _ in range(2 * len(dilations)))

    def forward(self, x: Tensor) -> Tensor:
        acts = list(self.activations)
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2)):
            x = x + c2(acts[2 * i + 1](c1(acts[2 * i](x))))
        return x


class BigVGAN(nn.Module):
    """BigVGAN v2 generator (inference). Build with :meth:`from_folder`; call under ``torch.inference_mode()``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        try:
            if str(config.get("resblock", "1")) != "1" or config.get("activation", "snakebeta") != "snakebeta":
                raise ModelFormatError("this BigVGAN uses another block or activation than v3's (AMP1, snakebeta); "
                                       "use models--nvidia--bigvgan_v2_24khz_100band_256x.")
            mels = int(config["num_mels"])
            ch = int(config["upsample_initial_channel"])
            rates = [int(u) for u in config["upsample_rates"]]
            kernels = [int(k) for k in config["upsample_kernel_sizes"]]
            rk = [int(k) for k in config["resblock_kernel_sizes"]]
            rd = [tuple(int(d) for d in ds) for ds in config["resblock_dilation_sizes"]]
            logscale = bool(config.get("snake_logscale", True))
            self.sample_rate = int(config["sampling_rate"])
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFormatError(f"BigVGAN config.json is incomplete ({e}); download the folder again.") from None
        self.use_tanh = bool(config.get("use_tanh_at_final", True))
        self.n_kernels = len(rk)
        self.hop = 1
        for u in rates:
            self.hop *= u
        self.conv_pre = nn.Conv1d(mels, ch, POST_KERNEL, padding=POST_KERNEL // 2)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (u, k) in enumerate(zip(rates, kernels)):
            cin, cout = ch // 2**i, ch // 2 ** (i + 1)
            self.ups.append(nn.ModuleList([nn.ConvTranspose1d(cin, cout, k, u, padding=(k - u) // 2)]))
            for kk, dd in zip(rk, rd):
                self.resblocks.append(_AMPBlock1(cout, kk, dd, logscale))
        last = ch // 2 ** len(rates)
        self.activation_post = _AntiAliased(last, logscale)
        self.conv_post = nn.Conv1d(last, 1, POST_KERNEL, padding=POST_KERNEL // 2,
                                   bias=bool(config.get("use_bias_at_final", True)))

    @classmethod
    def from_folder(cls, folder: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> BigVGAN:
        """Load ``config.json`` + ``bigvgan_generator.pt`` (restricted unpickling), fold weight norm."""
        return cls.from_checkpoint(load_bigvgan_checkpoint(folder), device, dtype)

    @classmethod
    def from_checkpoint(cls, ckpt: BigVGANCheckpoint, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> BigVGAN:
        """Build from a loaded folder; ModelFormatError lists weights that do not fit the config."""
        model = cls(ckpt.config)
        try:
            sd = fold_weight_norm(ckpt.state_dict)
        except KeyError as e:
            raise ModelFormatError(f"BigVGAN weights are inconsistent: {e.args[0]}") from None
        expected = model.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        wrong = [k for k in expected if k in sd and sd[k].shape != expected[k].shape]
        if missing or unexpected or wrong:
            raise ModelFormatError(f"BigVGAN weights do not fit its config.json: missing {missing[:3]}, unexpected "
                                   f"{unexpected[:3]}, mis-shaped {wrong[:3]}; download the folder again.")
        model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info("BigVGAN %d Hz, %.1f M params", model.sample_rate, sum(p.numel() for p in model.parameters()) / 1e6)
        return model

    def forward(self, mel: Tensor) -> Tensor:
        """Log-mel ``[B, 100, T]`` (denormalised) -> waveform ``[B, 1, hop T]`` in [-1, 1]."""
        x = self.conv_pre(mel)
        n = self.n_kernels
        for i, up in enumerate(self.ups):
            assert isinstance(up, nn.ModuleList)
            x = up[0](x)
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs = xs + self.resblocks[i * n + j](x)
            x = xs / n
        x = self.conv_post(self.activation_post(x))
        return torch.tanh(x) if self.use_tanh else torch.clamp(x, -1.0, 1.0)
