"""Merging a v3/v4 LoRA SoVITS file onto its base model, as upstream does at load (reference sections 1.1 and 9.1).

Upstream's LoRA trainer wraps the SoVITS's ``cfm`` with peft (``r = alpha = lora_rank``, targets ``to_q``, ``to_k``,
``to_v`` and ``to_out.0``), and saves only what it trained, in fp16: the LoRA pairs and ``cfm``'s buffers under peft's
names (``cfm.base_model.model.<name>``; a target's pair as ``<target>.lora_A.default.weight`` ``[r, in]`` and
``<target>.lora_B.default.weight`` ``[out, r]``, its own weights under ``<target>.base_layer.``), and every weight
outside ``cfm`` under its plain name. At load upstream builds the base model, wraps ``cfm`` again, loads the file on
top (strict=False: the file's tensors win; names the wrapped model lacks, plain ``cfm.`` names among them, are
ignored), then ``merge_and_unload()`` folds each pair into its
linear: ``W + (B @ A) * alpha / r`` in fp32. :func:`merge_lora` does the same on state dicts, without peft.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from engines.base import ModelFormatError

log = logging.getLogger(__name__)

__all__ = ["is_lora_weights", "merge_lora"]

PEFT_ROOT = "cfm.base_model.model."  # peft's PeftModel -> LoraModel -> the wrapped cfm
_LORA_KEY = re.compile(r"(?P<stem>.+)\.lora_(?P<side>[AB])\.(?P<adapter>[^.]+)\.weight")
ADAPTER = "default"  # the adapter name upstream's trainer gets from get_peft_model
TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # upstream's LoraConfig target_modules


def is_lora_weights(obj: dict[Any, Any], weight: dict[Any, Any]) -> bool:
    """Whether an unpickled SoVITS checkpoint is a LoRA file: it states ``lora_rank`` or holds peft-named tensors."""
    return "lora_rank" in obj or any(str(k).startswith(PEFT_ROOT) or ".lora_A." in str(k) for k in weight)


def merge_lora(path: Path, lora: dict[str, torch.Tensor], rank: object,
               base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's weights with a LoRA file's tensors on top and its pairs merged into their linears.

    Parameters
    ----------
    path:
        the LoRA file (named in errors).
    lora:
        its ``weight`` entry: peft names inside ``cfm``, plain names elsewhere.
    rank:
        its ``lora_rank`` (also peft's ``lora_alpha`` in upstream's trainer, so the pairs' scale is 1).
    base:
        the base SoVITS's upstream-named weights.

    Returns
    -------
    dict[str, torch.Tensor]
        upstream-named weights: the merged linears in fp32 (as upstream merges them), every other tensor as stored.

    Raises
    ------
    ModelFormatError
        one line: no or a bad ``lora_rank``, an A without its B (or the reverse), a pair or tensor whose shape does not
        fit the base, a pair for a layer the base does not have, or a tensor peft's LoRA does not write.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ModelFormatError(f"{path}: a LoRA file without a valid lora_rank (found {rank!r}); re-export it with "
                               "GPT-SoVITS's LoRA trainer.")
    alpha = rank  # upstream's trainer and loader set peft's lora_alpha to lora_rank too
    scaling = alpha / rank
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for key, tensor in lora.items():
        if key.startswith("cfm.") and not key.startswith(PEFT_ROOT):
            ignored.append(key)  # upstream loads into the peft-wrapped cfm, where a plain cfm name matches nothing
            continue
        name = _plain_name(key)
        found = _LORA_KEY.fullmatch(name)
        if found is not None:
            if found["adapter"] != ADAPTER or not found["stem"].endswith(tuple("." + t for t in TARGETS)):
                raise ModelFormatError(f"{path}: unexpected LoRA tensor {key}; only upstream's LoRA of the DiT's "
                                       f"attention ({', '.join(TARGETS)}, adapter {ADAPTER!r}) can be merged.")
            pairs.setdefault(found["stem"], {})[found["side"]] = tensor
        elif ".lora_" in name:
            raise ModelFormatError(f"{path}: unexpected LoRA tensor {key} (not a plain LoRA pair); only upstream's "
                                   "LoRA files can be merged.")
        elif name not in base:
            ignored.append(key)  # upstream loads with strict=False
        elif tensor.shape != base[name].shape:
            raise ModelFormatError(f"{path}: {name} is {tuple(tensor.shape)} but {tuple(base[name].shape)} in the "
                                   "base model; the LoRA was trained on another base, set models.sovits_base to it.")
        else:
            plain[name] = tensor
    merged = {**base, **plain}
    for stem, pair in pairs.items():
        merged[stem + ".weight"] = _merged_linear(path, stem, pair, merged, rank, scaling)
    if ignored:
        log.debug("%s: %d tensors the model lacks were ignored (as upstream does): %s", path, len(ignored),
                  ", ".join(ignored[:5]))
    log.info("merged LoRA %s (rank %d) onto its base: %d linears, %d other tensors", path, rank, len(pairs),
             len(plain))
    return merged


def _plain_name(key: str) -> str:
    """peft's name of a tensor inside ``cfm`` -> the plain model's (``base_layer`` dropped); others unchanged."""
    if not key.startswith(PEFT_ROOT):
        return key
    return "cfm." + key[len(PEFT_ROOT):].replace(".base_layer.", ".")


def _merged_linear(path: Path, stem: str, pair: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
                   rank: int, scaling: float) -> torch.Tensor:
    """``W + (B @ A) * scaling`` in fp32, as peft's merge computes it; the pair checked against ``W`` first."""
    if "A" not in pair or "B" not in pair:
        have, lack = ("A", "B") if "A" in pair else ("B", "A")
        raise ModelFormatError(f"{path}: {stem} has a lora_{have} but no lora_{lack}; the LoRA file is damaged, "
                               "export it again.")
    weight = weights.get(stem + ".weight")
    if weight is None:
        raise ModelFormatError(f"{path}: a LoRA pair for {stem}, which the base model does not have; set "
                               "models.sovits_base to the model the LoRA was trained on.")
    a, b = pair["A"], pair["B"]
    out_features, in_features = weight.shape
    if a.shape != (rank, in_features) or b.shape != (out_features, rank):
        raise ModelFormatError(f"{path}: {stem}'s LoRA pair is A {tuple(a.shape)}, B {tuple(b.shape)}, but rank "
                               f"{rank} on a {tuple(weight.shape)} linear needs A {(rank, in_features)}, B "
                               f"{(out_features, rank)}; the file is damaged or its base is another model.")
    return weight.float() + (b.float() @ a.float()) * scaling
