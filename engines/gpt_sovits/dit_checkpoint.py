"""Safe loading of the diffusion families' files: the v3/v4/v5dev/v5turbo SoVITS and their vocoders.

The same rules as :mod:`engines.gpt_sovits.checkpoint` (nothing in a file runs; torch's weights-only unpickler plus
upstream's ``utils.HParams``), for three more kinds of file (reference section 1):

* the SoVITS ``.pth`` (``SynthesizerTrnV3``): ``{"weight", "config", "info"}`` like v2, with the zip's ``PK``
  replaced by ``03`` (v3), ``04`` (v4), ``07`` (v5dev) or ``08`` (v5turbo), or a plain ``PK`` file (released v3/v4
  models and full fine-tunes); a ``03``/``04`` file is a LoRA fine-tune (``lora_rank`` in the dict), merged onto its
  base model as upstream merges it (:mod:`engines.gpt_sovits.dit_lora`);
* the 48 kHz HiFi-GAN ``vocoder.pth`` of v4/v5: a plain state dict, weight norm already removed;
* v3's BigVGAN folder: ``config.json`` + ``bigvgan_generator.pt`` = ``{"generator": state dict}`` (weight norm kept).

The family of a SoVITS file comes from its tag, else its file name (``s2Gv3.pth``, ``s2Gv4.pth``, ``s2Gv5dev.pth``,
``s2Gv5turbo.pth``), else its config's ``model.version``, else the family the caller expects; it is always checked
against the weights (v5 has no ``d_embed``), so a v5 file with a v4 header is refused, never guessed around.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.base import ModelFormatError
from engines.gpt_sovits.checkpoint import SovitsCheckpoint, _load_torch_file, _to_plain, is_dict  # pyright: ignore[reportPrivateUsage]
from engines.gpt_sovits.dit_lora import is_lora_weights, merge_lora
from engines.gpt_sovits.family import DIT_FAMILIES

log = logging.getLogger(__name__)

__all__ = ["load_dit_sovits_checkpoint", "load_vocoder48k_checkpoint", "load_bigvgan_checkpoint", "BigVGANCheckpoint",
           "is_dit_sovits", "is_lora_file"]

LORA_FILE_TAGS = (b"03", b"04")  # upstream head2version: the LoRA trainer's files
DIT_TAGS = {b"02": "v3", b"03": "v3", b"04": "v4", b"07": "v5dev", b"08": "v5turbo"}  # upstream head2version
RELEASED_NAMES = {"s2gv3.pth": "v3", "s2gv4.pth": "v4", "s2gv5dev.pth": "v5dev", "s2gv5turbo.pth": "v5turbo"}
STEP_EMBED_KEY = "cfm.estimator.d_embed.time_mlp.0.weight"  # present in v3/v4, absent in v5
DIT_KEY = "cfm.estimator.time_embed.time_mlp.0.weight"
VOCODER48K_KEYS = ("conv_pre.weight", "ups.0.weight", "conv_post.weight", "conv_post.bias")
BIGVGAN_WEIGHTS = "bigvgan_generator.pt"
BIGVGAN_CONFIG = "config.json"
HINT = "set models.family to the file's family (v3, v4, v5dev or v5turbo) or download the file again"


def load_dit_sovits_checkpoint(path: str | os.PathLike[str], expected: str | None = None,
                               base: str | os.PathLike[str] | None = None) -> SovitsCheckpoint:
    """Load a v3/v4/v5dev/v5turbo SoVITS ``.pth`` without running any code from it.

    Parameters
    ----------
    path:
        the file (upstream ``s2Gv4.pth``, ``s2Gv5turbo.pth``, a fine-tune, a LoRA fine-tune...).
    expected:
        the configured family; it decides only for an untagged file whose name and config do not say.
    base:
        the pretrained SoVITS a LoRA file was trained on (``models.sovits_base``); read only for a LoRA file, whose
        tensors go on top of it and whose pairs are merged in (:func:`engines.gpt_sovits.dit_lora.merge_lora`).

    Returns
    -------
    SovitsCheckpoint
        ``version`` is the family; tensors as stored (fp16 in released files), a LoRA's merged linears in fp32.

    Raises
    ------
    ModelFormatError
        unreadable, unsafe, a v2-family file, a LoRA file without its base (or with a malformed pair), a tag that
        contradicts the weights, or a DiT with blocks missing; one line that names the file and the fix.
    """
    path = Path(path)
    head, obj, sd = _read(path)
    if not is_lora_weights(obj, obj["weight"]):
        return _checked(path, head, obj, sd, expected)
    config = _to_plain(obj.get("config", {}))
    family = _family(path, head, True, config if is_dict(config) else {}, expected)
    base_path = _base_file(path, family, base)
    base_head, base_obj, base_sd = _read(base_path)
    if is_lora_weights(base_obj, base_obj["weight"]):
        raise ModelFormatError(f"{base_path}: models.sovits_base is itself a LoRA file; point it at the {family} "
                               f"pretrained SoVITS (`python -m bot models download --family {family}`).")
    pretrained = _checked(base_path, base_head, base_obj, base_sd, family)
    if pretrained.version != family:
        raise ModelFormatError(f"{path} is a {family} LoRA but its base {base_path} is a {pretrained.version} SoVITS; "
                               f"set models.sovits_base to the {family} pretrained SoVITS.")
    merged = merge_lora(path, sd, obj.get("lora_rank"), pretrained.state_dict)
    return _checked(path, head, obj, merged, family)


def _read(path: Path) -> tuple[bytes, dict[str, Any], dict[str, torch.Tensor]]:
    """A SoVITS file's tag, its unpickled dict (with a ``weight`` dict) and its tensors by name."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        head = b""  # _load_torch_file reports it
    obj = _load_torch_file(path, kind="SoVITS", accept=tuple(DIT_TAGS))
    if not is_dict(obj) or not is_dict(obj.get("weight")):
        raise ModelFormatError(f"{path}: not a GPT-SoVITS SoVITS checkpoint (expected a 'weight' entry).")
    sd: dict[str, torch.Tensor] = {str(k): v for k, v in obj["weight"].items() if isinstance(v, torch.Tensor)}
    return head, obj, sd


def _base_file(path: Path, family: str, base: str | os.PathLike[str] | None) -> Path:
    """The base model of a LoRA file, which must exist; a one-line ModelFormatError with the fix otherwise."""
    fetch = f"`python -m bot models download --family {family}` fetches it"
    if base is None:
        raise ModelFormatError(f"{path} is a {family} LoRA file, which needs its base model: set models.sovits_base "
                               f"to the {family} pretrained SoVITS ({fetch}).")
    if not Path(base).is_file():
        raise ModelFormatError(f"{path} is a {family} LoRA file and its base model {base} is missing: run "
                               f"`python -m bot models download --family {family}`, or set models.sovits_base.")
    return Path(base)


def _checked(path: Path, head: bytes, obj: dict[str, Any], sd: dict[str, torch.Tensor],
             expected: str | None) -> SovitsCheckpoint:
    """A diffusion-family checkpoint from a file's (or a merge's) tensors, its family checked against them."""
    if any(k.startswith(("model.ar_", "ar_")) for k in sd):
        raise ModelFormatError(f"{path}: this is a GPT model (.ckpt), not a SoVITS model (.pth); swap the two paths.")
    if DIT_KEY not in sd:
        raise ModelFormatError(f"{path}: this is a v2-family SoVITS (no DiT weights), not a v3/v4/v5 model; "
                               f"{HINT}.")
    config = _to_plain(obj.get("config", {}))
    if not is_dict(config) or not is_dict(config.get("model")):
        raise ModelFormatError(f"{path}: SoVITS checkpoint has no 'model' section in its config; "
                               "re-export it with GPT-SoVITS.")
    has_step = STEP_EMBED_KEY in sd
    version = _family(path, head, has_step, config, expected)
    v5 = version.startswith("v5")
    if v5 == has_step:
        said = f"its {head.decode('ascii', 'replace')} header" if head in DIT_TAGS else "its name or config"
        what = "v3/v4 weights (a DiT step embedding)" if has_step else "v5 weights (no DiT step embedding)"
        raise ModelFormatError(f"{path}: {said} says {version} but it holds {what}; the file is mis-tagged or "
                               f"damaged, {HINT}.")
    info = str(obj.get("info", ""))
    log.debug("loaded %s SoVITS checkpoint %s (%d tensors, info %r)", version, path, len(sd), info)
    return SovitsCheckpoint(state_dict=sd, config=config, version=version, info=info)


def _family(path: Path, head: bytes, has_step: bool, config: dict[str, Any], expected: str | None) -> str:
    """The family by tag, then name, then config, then the caller's expectation, then the weights."""
    tagged = DIT_TAGS.get(head)
    if tagged is not None:
        return tagged
    named = RELEASED_NAMES.get(path.name.lower())
    if named is not None:
        return named
    stated = str(config.get("model", {}).get("version", ""))
    stated = "v5dev" if stated == "v5" else stated
    if stated in DIT_FAMILIES:
        return stated
    if expected is not None and expected in DIT_FAMILIES:
        return expected
    if not has_step:
        return "v5dev"  # upstream's own rule for an untagged v5 file
    raise ModelFormatError(f"{path}: a v3 or v4 SoVITS whose header, name and config do not say which; "
                           f"set models.family to v3 or v4.")


def load_vocoder48k_checkpoint(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Load the v4/v5 48 kHz HiFi-GAN ``vocoder.pth`` (a plain state dict after weight-norm removal).

    Raises
    ------
    ModelFormatError
        unreadable, unsafe, or not that vocoder (a SoVITS/GPT file, or keys missing).
    """
    path = Path(path)
    obj: Any = _load_torch_file(path, kind="vocoder", accept=tuple(DIT_TAGS))
    if is_dict(obj) and is_dict(obj.get("weight")):
        raise ModelFormatError(f"{path}: this is a GPT-SoVITS model, not the vocoder; point models.vocoder at "
                               "gsv-v4-pretrained/vocoder.pth (v4) or gsv-v5-pretrained/vocoder.pth (v5).")
    if not is_dict(obj) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelFormatError(f"{path}: not a vocoder state dict (found {type(obj).__name__}); download "
                               "vocoder.pth again.")
    sd = {str(k): v for k, v in obj.items()}
    missing = [k for k in VOCODER48K_KEYS if k not in sd]
    if missing:
        raise ModelFormatError(f"{path}: not the v4/v5 48 kHz vocoder (lacks {', '.join(missing)}); download "
                               "vocoder.pth again.")
    return sd


@dataclass(frozen=True)
class BigVGANCheckpoint:
    """v3's BigVGAN: ``config`` from ``config.json``, ``state_dict`` with weight norm (``weight_g``/``weight_v``)."""

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]


def load_bigvgan_checkpoint(folder: str | os.PathLike[str]) -> BigVGANCheckpoint:
    """Load v3's vocoder folder (``models--nvidia--bigvgan_v2_24khz_100band_256x``: ``config.json`` +
    ``bigvgan_generator.pt``).

    Raises
    ------
    ModelFormatError
        a file missing, unreadable or unsafe, or not a BigVGAN generator.
    """
    folder = Path(folder)
    cfg_path = folder / BIGVGAN_CONFIG
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{cfg_path} does not exist; point models.vocoder at the BigVGAN folder "
                               "models--nvidia--bigvgan_v2_24khz_100band_256x.") from None
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{cfg_path} is unreadable ({e}); download the BigVGAN folder again.") from None
    if not is_dict(config):
        raise ModelFormatError(f"{cfg_path}: not a BigVGAN config (top level is {type(config).__name__}).")
    obj: Any = _load_torch_file(folder / BIGVGAN_WEIGHTS, kind="BigVGAN vocoder")
    sd = obj.get("generator") if is_dict(obj) else None
    if not is_dict(sd) or "conv_pre.weight_v" not in sd and "conv_pre.weight" not in sd:
        raise ModelFormatError(f"{folder / BIGVGAN_WEIGHTS}: not a BigVGAN generator (no 'generator' weights); "
                               "download the BigVGAN folder again.")
    return BigVGANCheckpoint(config=config, state_dict={str(k): v for k, v in sd.items() if isinstance(v, torch.Tensor)})


def is_dit_sovits(path: str | os.PathLike[str]) -> bool:
    """Whether a SoVITS file is of a diffusion family (v3/v4/v5dev/v5turbo), told without loading its tensors: by its
    tag, its released name, else by its keys (a memory-mapped read of the index only). False for a missing file (the
    loader that opens it names it)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    if head in DIT_TAGS or path.name.lower() in RELEASED_NAMES:
        return True
    if head != b"PK":
        return False  # a v2-family tag (v2Pro, v2ProPlus)
    obj = _load_torch_file(path, kind="SoVITS", accept=tuple(DIT_TAGS))
    return is_dict(obj) and is_dict(obj.get("weight")) and DIT_KEY in obj["weight"]


def is_lora_file(path: str | os.PathLike[str]) -> bool:
    """Whether a SoVITS file carries upstream's LoRA tag (``03`` v3, ``04`` v4): its weights need its base model."""
    with open(path, "rb") as f:
        return f.read(2) in LORA_FILE_TAGS
