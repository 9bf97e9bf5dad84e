"""Safe loading of GPT-SoVITS checkpoints in upstream's on-disk formats.

Two kinds of file exist (see the upstream reference, section 8):

* the GPT (``.ckpt``): a torch zip of ``{"weight": {"model.<name>": fp16}, "config": <yaml dict>, "info": str}``;
* the SoVITS (``.pth``): a torch zip of ``{"weight": {name: fp16}, "config": utils.HParams, "info": str}``, where
  v2Pro/v2ProPlus and v3/v4 LoRA files have the zip's ``PK`` magic overwritten by a 2-byte version tag.

Nothing in a file is ever executed: the pickle is read by torch's ``weights_only`` unpickler, which admits tensors,
storages and plain containers, plus upstream's attribute bag ``utils.HParams`` mapped to :class:`HParams` here.
A file that asks for anything else is refused with :class:`ModelFormatError` before any of it runs.
Loaders return tensors exactly as stored (fp16 in released files); the model builders cast them.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.base import ModelFormatError

log = logging.getLogger(__name__)

__all__ = [
    "GptCheckpoint",
    "SovitsCheckpoint",
    "load_gpt_checkpoint",
    "load_sovits_checkpoint",
    "file_fingerprint",
    "HParams",
]

ZIP_MAGIC = b"PK"  # first 2 bytes of every torch zip (and of plain v1/v2/v3/v4 files)
PICKLE_MAGIC = b"\x80"  # first byte of torch's legacy (pre-1.6, non-zip) format: a raw pickle
# Upstream's version tags that replace "PK" (process_ckpt.my_save2); value: (name, supported)
VERSION_MAGICS: dict[bytes, tuple[str, bool]] = {
    b"00": ("v1", False),
    b"01": ("v2", True),
    b"02": ("v3", False),
    b"03": ("v3 LoRA", False),
    b"04": ("v4 LoRA", False),
    b"05": ("v2Pro", False),
    b"06": ("v2ProPlus", False),
}
V2_SYMBOLS = 732  # phone table size of v2 (text/symbols2.py)
V1_SYMBOLS = 322  # phone table size of v1 (SoVITS text embedding rows)
V1_GPT_PHONEMES = 512  # phoneme_vocab_size of v1 GPT files
SEMANTIC_VOCAB = 1025  # 1024 codes + EOS
FINGERPRINT_HEX = 16  # hex digits of sha256 kept by file_fingerprint
_HASH_BLOCK = 1 << 20  # bytes read per hash update


class HParams:
    """Stand-in for upstream's ``utils.HParams`` attribute bag, so pickled configs load without upstream code."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def __contains__(self, key: object) -> bool:
        return key in self.__dict__

    def __repr__(self) -> str:
        return f"HParams({self.__dict__!r})"


@dataclass(frozen=True)
class GptCheckpoint:
    """A GPT (Text2SemanticDecoder) checkpoint.

    Attributes
    ----------
    state_dict:
        parameter name (Lightning ``model.`` prefix stripped) -> tensor, dtype as stored (fp16 in released files).
    config:
        the training YAML dict stored in the file (``model``, ``data``, ...).
    info:
        the file's info string, e.g. ``"GPT-e15"``.
    """

    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]
    info: str


@dataclass(frozen=True)
class SovitsCheckpoint:
    """A SoVITS (SynthesizerTrn) checkpoint.

    Attributes
    ----------
    state_dict:
        parameter name -> tensor, dtype as stored (``enc_q.*`` usually absent in fine-tuned files).
    config:
        the hyper-parameters (``data``, ``model``, ``train``...) as nested plain dicts.
    version:
        the model family, ``"v2"`` (the only one accepted so far).
    info:
        the file's info string, e.g. ``"8epoch_1200iteration"``.
    """

    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]
    version: str
    info: str


def load_gpt_checkpoint(path: str | os.PathLike[str]) -> GptCheckpoint:
    """Load a GPT-SoVITS v2 GPT ``.ckpt`` without running any code from it.

    Parameters
    ----------
    path:
        the ``.ckpt`` file (upstream ``s1_train.py`` / ``my_save`` format).

    Raises
    ------
    ModelFormatError
        unreadable, unsafe (contains code), or not a v2 GPT file; the message names the file and the fix.
    """
    path = Path(path)
    obj = _load_torch_file(path, kind="GPT")
    if not isinstance(obj, dict):
        raise ModelFormatError(f"{path}: not a GPT-SoVITS GPT checkpoint (top level is {type(obj).__name__}).")
    weights = obj.get("weight")
    if weights is None:
        weights = obj.get("state_dict")  # a raw Lightning training checkpoint
    config = obj.get("config")
    if not isinstance(weights, dict) or not isinstance(config, dict):
        if isinstance(config, HParams) or _looks_like_sovits(weights):
            raise ModelFormatError(
                f"{path}: this is a SoVITS model (.pth), not a GPT model (.ckpt); "
                f"swap the two paths."
            )
        raise ModelFormatError(
            f"{path}: not a GPT-SoVITS GPT checkpoint (expected 'weight' and 'config' entries, found {sorted(obj)})."
        )
    model_cfg = config.get("model")
    if not isinstance(model_cfg, dict):
        raise ModelFormatError(
            f"{path}: GPT checkpoint has no 'model' section in its config; "
            f"re-export it with GPT-SoVITS."
        )
    state_dict = {_strip_prefix(k): v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    if any(k.startswith("cfm.") or k.startswith("enc_p.") for k in state_dict):
        raise ModelFormatError(f"{path}: this is a SoVITS model, not a GPT model (.ckpt); swap the two paths.")
    phonemes = int(model_cfg.get("phoneme_vocab_size", -1))
    vocab = int(model_cfg.get("vocab_size", -1))
    if phonemes == V1_GPT_PHONEMES:
        raise ModelFormatError(
            f"{path}: this is a GPT-SoVITS v1 GPT (512 phonemes); "
            f"v1 is not supported, use a v2 model."
        )
    if phonemes != V2_SYMBOLS or vocab != SEMANTIC_VOCAB:
        raise ModelFormatError(
            f"{path}: GPT with phoneme_vocab_size={phonemes}, vocab_size={vocab} is not a v2 model "
            f"(expected {V2_SYMBOLS}/{SEMANTIC_VOCAB}); use a GPT-SoVITS v2 GPT file."
        )
    info = str(obj.get("info", ""))
    log.debug("loaded GPT checkpoint %s (%d tensors, info %r)", path, len(state_dict), info)
    return GptCheckpoint(state_dict=state_dict, config=_to_plain(config), info=info)


def load_sovits_checkpoint(path: str | os.PathLike[str]) -> SovitsCheckpoint:
    """Load a GPT-SoVITS v2 SoVITS ``.pth`` without running any code from it.

    The pickled ``utils.HParams`` config of fine-tuned files is accepted and returned as nested dicts. Version-tagged
    files (v2Pro, v2ProPlus, v3/v4 LoRA), full v3/v4 models and v1 models are recognised and refused.

    Parameters
    ----------
    path:
        the ``.pth`` file (upstream ``process_ckpt.savee`` format, or a pretrained ``s2G*.pth``).

    Raises
    ------
    ModelFormatError
        unreadable, unsafe (contains code), or not a v2 SoVITS file; the message names the file and the fix.
    """
    path = Path(path)
    obj = _load_torch_file(path, kind="SoVITS")
    if not isinstance(obj, dict):
        raise ModelFormatError(f"{path}: not a GPT-SoVITS SoVITS checkpoint (top level is {type(obj).__name__}).")
    weights = obj.get("weight")
    if not isinstance(weights, dict):
        raise ModelFormatError(
            f"{path}: not a GPT-SoVITS SoVITS checkpoint (expected a 'weight' entry, found {sorted(map(str, obj))})."
        )
    state_dict = {str(k): v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    if any(k.startswith("model.ar_") or k.startswith("ar_") for k in state_dict):
        raise ModelFormatError(f"{path}: this is a GPT model (.ckpt), not a SoVITS model (.pth); swap the two paths.")
    if "lora_rank" in obj:
        raise ModelFormatError(f"{path}: v3/v4 LoRA files are not supported yet; use a v2 model.")
    if any(k.startswith("cfm.") for k in state_dict):
        raise ModelFormatError(f"{path}: v3/v4 SoVITS models are not supported yet; use a v2 model.")
    if any(k.startswith("sv_emb.") or k.startswith("ge_to512.") for k in state_dict):
        raise ModelFormatError(f"{path}: v2Pro files are not supported yet; use a v2 model.")
    emb = state_dict.get("enc_p.text_embedding.weight")
    if emb is None:
        raise ModelFormatError(
            f"{path}: SoVITS checkpoint lacks 'enc_p.text_embedding.weight'; "
            f"the file is incomplete."
        )
    if emb.shape[0] == V1_SYMBOLS:
        raise ModelFormatError(
            f"{path}: this is a GPT-SoVITS v1 SoVITS model (322 symbols); "
            f"v1 is not supported, use a v2 model."
        )
    if emb.shape[0] != V2_SYMBOLS:
        raise ModelFormatError(
            f"{path}: SoVITS text embedding has {emb.shape[0]} symbols, expected {V2_SYMBOLS} (v2); use a v2 model."
        )
    config = _to_plain(obj.get("config", {}))
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise ModelFormatError(
            f"{path}: SoVITS checkpoint has no 'model' section in its config; "
            f"re-export it with GPT-SoVITS."
        )
    info = str(obj.get("info", ""))
    log.debug("loaded SoVITS checkpoint %s (%d tensors, info %r)", path, len(state_dict), info)
    return SovitsCheckpoint(state_dict=state_dict, config=config, version="v2", info=info)


_fingerprints: dict[tuple[str, int, int], str] = {}
_fingerprints_lock = threading.Lock()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """A short stable id of a model file: the first 16 hex digits of the SHA-256 of its bytes.

    Cached in-process per (absolute path, size, mtime), so asking again is free until the file changes.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    with _fingerprints_lock:
        hit = _fingerprints.get(key)
    if hit is not None:
        return hit
    digest = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    value = digest.hexdigest()[:FINGERPRINT_HEX]
    with _fingerprints_lock:
        _fingerprints[key] = value
    return value


def _load_torch_file(path: Path, kind: str) -> Any:
    """Open a torch checkpoint safely: check the magic, then unpickle with the weights-only unpickler."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(2)
    except FileNotFoundError:
        raise ModelFormatError(f"{kind} model file {path} does not exist; check the path in config.yaml.") from None
    except OSError as e:
        raise ModelFormatError(f"{kind} model file {path} cannot be read ({e}); check its permissions.") from e
    if size == 0:
        raise ModelFormatError(f"{kind} model file {path} is empty; download it again.")
    source: str | io.BytesIO
    mmap = False
    if head == ZIP_MAGIC:
        source, mmap = str(path), True
    elif head in VERSION_MAGICS:
        name, supported = VERSION_MAGICS[head]
        if not supported:
            raise ModelFormatError(f"{path}: {name} files are not supported yet; use a v2 model.")
        # Restore the zip magic in memory only; the file on disk stays as it is.
        data = bytearray(path.read_bytes())
        data[:2] = ZIP_MAGIC
        source = io.BytesIO(bytes(data))
    elif head[:1] == PICKLE_MAGIC:
        source = io.BytesIO(path.read_bytes())
    else:
        raise ModelFormatError(
            f"{path} is not a PyTorch checkpoint (starts with {head!r}); expected a GPT-SoVITS v2 {kind} file, "
            "download it again."
        )
    try:
        with torch.serialization.safe_globals([(HParams, "utils.HParams")]):
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        unsafe = _unsafe_globals(path, head)
        if unsafe or "Unsupported global" in str(e) or "Unsupported operand" in str(e):
            what = ", ".join(unsafe) if unsafe else "code"
            raise ModelFormatError(
                f"{path} contains code ({what}) and was not loaded; use a model file from a trusted source."
            ) from None
        raise ModelFormatError(f"{path} is corrupt ({e}); download it again.") from e
    except (RuntimeError, EOFError, ValueError, KeyError, OSError) as e:
        raise ModelFormatError(f"{path} is truncated or corrupt ({e}); download it again.") from e


def _unsafe_globals(path: Path, head: bytes) -> list[str]:
    """Names of pickle globals in the file outside the weights-only allow list (static scan, nothing runs)."""
    try:
        data = path.read_bytes()
        if head in VERSION_MAGICS:
            data = ZIP_MAGIC + data[2:]
        with torch.serialization.safe_globals([(HParams, "utils.HParams")]):
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))
    except Exception:  # a damaged file: the caller reports it as code-bearing or corrupt anyway
        return []


def _strip_prefix(name: str) -> str:
    """Drop the Lightning module prefix ``model.`` from a GPT parameter name."""
    return name[len("model.") :] if name.startswith("model.") else name


def _looks_like_sovits(weights: object) -> bool:
    """True if a weight dict has SoVITS parameter names."""
    return isinstance(weights, dict) and any(str(k).startswith("enc_p.") for k in weights)


def _to_plain(value: Any) -> Any:
    """Turn HParams and OrderedDicts into nested plain dicts/lists."""
    if isinstance(value, HParams):
        value = value.__dict__
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value
