"""Seeded random v3/v4/v5dev/v5turbo SoVITS and vocoder files in upstream's formats (for :func:`write_model_set`).

The files are laid out and written as the released ones are (reference section 1): ``s2Gv3.pth`` and
``gsv-v4-pretrained/s2Gv4.pth`` plain torch zips, ``gsv-v5-pretrained/s2Gv5dev.pth`` / ``s2Gv5turbo.pth`` with
their ``07`` / ``08`` tags, the 48 kHz ``vocoder.pth`` as a plain state dict, and v3's BigVGAN folder
(``config.json`` + ``bigvgan_generator.pt`` with weight norm). ``"tiny"`` is small enough for CI; ``"real"`` has the
released tensor names and shapes (``tests/data/golden-v4v5/real_size_shapes.json``).

Random weights are shaped to behave, not to sound: the vocoders' last conv is scaled on one calibration pass so the
waveform is audible and not clipped (RMS about 0.1-0.3).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch

from engines.gpt_sovits.bigvgan import BigVGAN
from engines.gpt_sovits.checkpoint import tagged_checkpoint
from engines.gpt_sovits.dit_checkpoint import BigVGANCheckpoint
from engines.gpt_sovits.family import DIT_FAMILIES, family_spec
from engines.gpt_sovits.mel import denorm_spec
from engines.gpt_sovits.mel_sovits import MelSoVITS, MelSovitsConfig
from engines.gpt_sovits.dit import DitConfig
from engines.gpt_sovits.vocoder48k import Vocoder48k

__all__ = ["DIT_LAYOUT", "write_dit_family"]

# (SoVITS file, vocoder file or folder, version tag replacing "PK" or None) as released
DIT_LAYOUT: dict[str, tuple[str, str, bytes | None]] = {
    "v3": ("s2Gv3.pth", "models--nvidia--bigvgan_v2_24khz_100band_256x", None),
    "v4": ("gsv-v4-pretrained/s2Gv4.pth", "gsv-v4-pretrained/vocoder.pth", None),
    "v5dev": ("gsv-v5-pretrained/s2Gv5dev.pth", "gsv-v5-pretrained/vocoder.pth", b"07"),
    "v5turbo": ("gsv-v5-pretrained/s2Gv5turbo.pth", "gsv-v5-pretrained/vocoder.pth", b"08"),
}
GPT_LAYOUT = "s1v3.ckpt"  # the GPT every diffusion family uses (same class and format as v2's)
# (hidden, filter, layers, gin, codebook) of the text encoder side; (dim, depth, heads, ff, text, wn hidden, wn layers)
SOVITS_SIZES = {"tiny": (64, 256, 2, 128, 1024), "real": (192, 768, 6, 512, 1024)}
DIT_SIZES = {"tiny": (64, 2, 2, 128, 48, 32, 2), "real": (1024, 22, 16, 2048, 512, 512, 8)}
DIT_HEAD = 64  # dim_head (released and tiny)
TEXT_CONV_LAYERS = 4
WN_KERNEL = 5
BRIDGE = 512  # upstream's inter_channels2
STYLE_HIDDEN = 128
VOCODER48K_CHANNELS = {"tiny": 32, "real": 512}
VOCODER48K_KERNELS = (20, 12, 4, 4, 4)
BIGVGAN_CHANNELS = {"tiny": 64, "real": 1536}
TARGET_STD = 0.25  # the random vocoders' pre-tanh output spread after calibration
BIGVGAN_CONFIG: dict[str, Any] = {  # NVIDIA's bigvgan_v2_24khz_100band_256x hyper-parameters (reference 7.2)
    "resblock": "1", "upsample_rates": [4, 4, 2, 2, 2, 2], "upsample_kernel_sizes": [8, 8, 4, 4, 4, 4],
    "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "use_tanh_at_final": False, "use_bias_at_final": False, "activation": "snakebeta", "snake_logscale": True,
    "num_mels": 100, "num_freq": 1025, "n_fft": 1024, "hop_size": 256, "win_size": 1024, "sampling_rate": 24000,
    "fmin": 0, "fmax": None, "fmax_for_loss": None,
}
_WEIGHT_NORMED_SOVITS = ("wns1.enc.in_layers.", "wns1.enc.res_skip_layers.", "wns1.enc.cond_layer.")


def write_dit_family(root: Path, family: str, size: str, seed: int,
                     atomic: Callable[[Path, Callable[[str], None]], None]) -> dict[str, Path]:
    """Write ``family``'s SoVITS and vocoder under ``root``; returns ``{"sovits": file, "vocoder": file or folder}``.

    ``atomic(path, write)`` writes one file safely (the caller's temp-file-and-rename).
    """
    if family not in DIT_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(DIT_FAMILIES)}, got {family!r}")
    sovits_rel, vocoder_rel, tag = DIT_LAYOUT[family]
    paths = {"sovits": root / sovits_rel, "vocoder": root / vocoder_rel}
    ckpt = {"weight": sovits_state_dict(family, size, seed), "config": sovits_config(family, size),
            "info": "1epoch_1iteration"}
    data = tagged_checkpoint(ckpt, tag)
    def write_sovits(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    atomic(paths["sovits"], write_sovits)
    gen = torch.Generator().manual_seed(seed + 7)
    if family == "v3":
        config = dict(BIGVGAN_CONFIG, upsample_initial_channel=BIGVGAN_CHANNELS[size])
        generator = {"generator": _bigvgan_state_dict(config, gen)}
        def write_config(tmp: str) -> None:
            Path(tmp).write_text(json.dumps(config, indent=4), encoding="utf-8")

        atomic(paths["vocoder"] / "config.json", write_config)
        atomic(paths["vocoder"] / "bigvgan_generator.pt", lambda tmp: torch.save(generator, tmp))
    else:
        sd = _vocoder48k_state_dict(size, gen)
        atomic(paths["vocoder"], lambda tmp: torch.save(sd, tmp))
    return paths


def sovits_config(family: str, size: str) -> dict[str, Any]:
    """An ``s2.json``-like config (what upstream's trainer stores) with ``model.version`` set."""
    hidden, filt, layers, gin, _ = SOVITS_SIZES[size]
    return {
        "data": {"max_wav_value": 32768.0, "sampling_rate": 32000, "filter_length": 2048, "hop_length": 640,
                 "win_length": 2048, "n_mel_channels": 128, "mel_fmin": 0.0, "mel_fmax": None, "add_blank": True,
                 "n_speakers": 300, "cleaned_text": True},
        "model": {"inter_channels": hidden, "hidden_channels": hidden, "filter_channels": filt, "n_heads": 2,
                  "n_layers": layers, "kernel_size": 3, "p_dropout": 0.1, "resblock": "1",
                  "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5]] * 3,
                  "upsample_rates": [10, 8, 2, 2, 2], "upsample_initial_channel": 512,
                  "upsample_kernel_sizes": [16, 16, 8, 2, 2], "n_layers_q": 3, "use_spectral_norm": False,
                  "gin_channels": gin, "semantic_frame_rate": "25hz", "freeze_quantizer": True, "version": family},
        "version": family,
    }


def _sovits_model_config(family: str, size: str) -> MelSovitsConfig:
    hidden, filt, layers, gin, codebook = SOVITS_SIZES[size]
    dim, depth, heads, ff, text, wn_hidden, wn_layers = DIT_SIZES[size]
    dit = DitConfig(dim=dim, depth=depth, heads=heads, dim_head=DIT_HEAD, ff_inner=ff, text_dim=text,
                    text_inner=2 * text, conv_layers=TEXT_CONV_LAYERS, step_embedding=family in ("v3", "v4"))
    return MelSovitsConfig(
        family=family_spec(family), inter_channels=hidden, hidden_channels=hidden, filter_channels=filt, n_heads=2,
        n_layers=layers, kernel_size=3, n_symbols=732, mrte_hidden=gin, codebook_size=codebook, style_bins=704,
        style_hidden=STYLE_HIDDEN, gin_channels=gin, bridge_channels=BRIDGE, wn_hidden=wn_hidden,
        wn_kernel=WN_KERNEL, wn_layers=wn_layers, feature_dim=text, dit=dit,
    )


def sovits_state_dict(family: str, size: str, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights under upstream's names (``cfm.estimator.*`` with separate q/k/v, weight-normed
    ``wns1``, the quantizer's statistics and ``linear_mel``), fp16 as released."""
    cfg = _sovits_model_config(family, size)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in MelSoVITS(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    inner = cfg.dit.inner
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        leaf = name.rsplit(".", 1)[-1]
        if name == "codebook":
            sd["quantizer.vq.layers.0._codebook.embed"] = 0.6 * noise
            continue
        if name == "dit.inv_freq":
            sd["cfm.estimator.rotary_embed.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, DIT_HEAD, 2).float() / DIT_HEAD)
            continue
        if leaf == "gamma" and "grn" not in name:
            value = 1.0 + 0.1 * noise
        elif leaf in ("beta", "bias", "gamma"):
            value = 0.05 * noise
        elif leaf.startswith("emb_rel_"):
            value = noise / math.sqrt(shape[-1])
        elif name == "enc_p.text_embedding.weight":
            value = 0.5 * noise
        elif len(shape) == 1:  # LayerNorm scales
            value = 1.0 + 0.05 * noise
        else:
            value = noise / math.sqrt(math.prod(shape[1:]))
        if name.startswith("dit."):
            stem = "cfm.estimator." + name[len("dit."):]
            if ".attn.qkv." in stem:
                for i, p in enumerate("qkv"):
                    sd[stem.replace(".qkv.", f".to_{p}.")] = value[i * inner : (i + 1) * inner]
                continue
            sd[stem] = value
        elif name.startswith(_WEIGHT_NORMED_SOVITS) and leaf == "weight":
            stem = name[: -len(".weight")]
            norm = value.flatten(1).pow(2).sum(1).sqrt().view(-1, *([1] * (value.dim() - 1)))
            sd[stem + ".weight_v"] = value
            sd[stem + ".weight_g"] = norm
        else:
            sd[name] = value
    cb = sd["quantizer.vq.layers.0._codebook.embed"]
    sd["quantizer.vq.layers.0._codebook.inited"] = torch.ones(1)
    sd["quantizer.vq.layers.0._codebook.cluster_size"] = torch.full((cb.shape[0],), 26.0)
    sd["quantizer.vq.layers.0._codebook.embed_avg"] = 26.0 * cb
    sd["linear_mel.weight"] = torch.randn(100, BRIDGE, 1, generator=gen) / math.sqrt(BRIDGE)
    sd["linear_mel.bias"] = torch.zeros(100)
    return {k: v.half() for k, v in sd.items()}


def _calibrated(model: torch.nn.Module, post: torch.nn.Conv1d, gen: torch.Generator) -> None:
    """Scale (and centre) ``post`` so the pre-activation output of a calibration mel has :data:`TARGET_STD`."""
    mel = denorm_spec(torch.randn(1, 100, 16, generator=gen))
    captured: list[torch.Tensor] = []

    def keep(_m: torch.nn.Module, _i: object, out: torch.Tensor) -> None:
        captured.append(out)

    handle = post.register_forward_hook(keep)
    with torch.inference_mode():
        model(mel)
    handle.remove()
    out = captured[0]
    with torch.no_grad():
        post.weight.mul_(TARGET_STD / max(float(out.std()), 1e-6))
        if post.bias is not None:
            post.bias.sub_(float(out.mean()) * TARGET_STD / max(float(out.std()), 1e-6))


def _vocoder48k_state_dict(size: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    model = Vocoder48k(VOCODER48K_CHANNELS[size], VOCODER48K_KERNELS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=gen) if name.endswith("bias")
                    else torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]) or 1))
    _calibrated(model, model.conv_post, gen)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}  # fp32, as upstream saves it


def _kaiser_sinc(kernel: int = 12, ratio: int = 2) -> torch.Tensor:
    """BigVGAN's anti-aliasing low-pass ``[1, 1, kernel]`` (cut-off 0.5/ratio, half-width 0.6/ratio, Kaiser)."""
    cutoff, half_width, half = 0.5 / ratio, 0.6 / ratio, kernel // 2
    a = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    beta = 0.1102 * (a - 8.7) if a > 50 else 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21) if a >= 21 else 0.0
    window = torch.kaiser_window(kernel, periodic=False, beta=beta)
    t = torch.arange(-half, half) + 0.5
    f = 2 * cutoff * window * torch.sinc(2 * cutoff * t)
    return (f / f.sum()).view(1, 1, kernel)


def _bigvgan_state_dict(config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random BigVGAN weights in the file's layout: weight norm (``weight_g``/``weight_v``), stored filters."""
    model = BigVGAN(config)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "filter":
                t.copy_(_kaiser_sinc())
            elif leaf in ("alpha", "beta"):
                t.copy_(0.1 * torch.randn(t.shape, generator=gen))
            elif leaf == "bias":
                t.copy_(0.01 * torch.randn(t.shape, generator=gen))
            else:
                fan = t.shape[1] * t.shape[2] if "ups." not in name else t.shape[0] * t.shape[2]
                t.copy_(torch.randn(t.shape, generator=gen) / math.sqrt(fan))
    _calibrated(model, model.conv_post, gen)
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.endswith(".weight") and t.dim() == 3 and ("conv" in name or "ups." in name):
            stem = name[: -len(".weight")]
            out[stem + ".weight_v"] = t.clone()
            out[stem + ".weight_g"] = t.flatten(1).pow(2).sum(1).sqrt().view(-1, 1, 1)
        else:
            out[name] = t.clone()
    BigVGAN.from_checkpoint(BigVGANCheckpoint(config, out))  # the layout loads back
    return out



LORA_TAGS = {"v3": b"03", "v4": b"04"}  # upstream's tags for its LoRA trainer's files
_LORA_TARGETS = (".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".attn.to_out.0.weight")


def write_dit_lora(path: Path, family: str, size: str, seed: int, rank: int,
                   atomic: Callable[[Path, Callable[[str], None]], None]) -> Path:
    """A seeded LoRA fine-tune of ``family``'s SoVITS (the one :func:`write_dit_family` writes with ``seed``), saved as
    upstream's LoRA trainer saves it: the ``03``/``04`` tag, ``lora_rank``, fp16, the DiT attention's LoRA pairs and
    ``cfm``'s rotary table under peft's names (``cfm.base_model.model.<name>``, ``lora_A.default``/``lora_B.default``),
    every weight outside ``cfm`` under its own name (shifted a little, as training moves them), the frozen DiT not at
    all. The file needs its base model to load (:mod:`engines.gpt_sovits.dit_lora`)."""
    if family not in LORA_TAGS:
        raise ValueError(f"LoRA files exist for v3 and v4 only, got {family!r}")
    gen = torch.Generator().manual_seed(seed + 11)
    weight: dict[str, torch.Tensor] = {}
    for name, value in sovits_state_dict(family, size, seed).items():
        peft_name = "cfm.base_model.model." + name[len("cfm."):]
        if name.endswith(_LORA_TARGETS):
            stem = peft_name[: -len(".weight")]
            out_features, in_features = value.shape
            weight[stem + ".lora_A.default.weight"] = torch.randn(rank, in_features, generator=gen) / in_features ** 0.5
            weight[stem + ".lora_B.default.weight"] = 0.2 * torch.randn(out_features, rank, generator=gen) / rank ** 0.5
        elif name.endswith(".inv_freq"):
            weight[peft_name] = value  # a buffer: saved whether trained or not
        elif not name.startswith("cfm.") and value.dim() >= 2:  # the matrices move by about 1 %
            weight[name] = value.float() + 0.01 * value.float().abs().mean() * torch.randn(value.shape, generator=gen)
        elif not name.startswith("cfm."):
            weight[name] = value
    ckpt = {"weight": {k: v.half() for k, v in weight.items()}, "config": sovits_config(family, size),
            "info": "1epoch_1iteration", "lora_rank": rank}
    data = tagged_checkpoint(ckpt, LORA_TAGS[family])

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    atomic(path, write)
    return path
