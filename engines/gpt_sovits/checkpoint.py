"""Safe loading of GPT-SoVITS checkpoints in upstream's on-disk formats.

Three kinds of file exist (see the upstream reference, section 8):

* the GPT (``.ckpt``): a torch zip of ``{"weight": {"model.<name>": fp16}, "config": <yaml dict>, "info": str}``;
* the SoVITS (``.pth``): a torch zip of ``{"weight": {name: fp16}, "config": utils.HParams, "info": str}``, where
  v2Pro/v2ProPlus (``05``/``06``) and v3/v4 LoRA files have the zip's ``PK`` magic overwritten by a 2-byte version tag;
* the speaker-verification model of v2Pro/v2ProPlus (``sv/pretrained_eres2netv2w24s4ep4.ckpt``): a plain torch
  ``state_dict`` (name -> tensor) of an ERes2NetV2.

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
from typing import Any, Collection, Sequence, TypeGuard, cast

import torch

from engines.base import EngineError, ModelFormatError

log = logging.getLogger(__name__)

__all__ = [
    "GptCheckpoint",
    "SovitsCheckpoint",
    "load_gpt_checkpoint",
    "load_sovits_checkpoint",
    "load_sv_checkpoint",
    "file_fingerprint",
    "model_id",
    "require_model_files",
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
    b"05": ("v2Pro", True),
    b"06": ("v2ProPlus", True),
    b"07": ("v5dev", False),
    b"08": ("v5turbo", False),
}
V2PRO_VERSIONS = ("v2Pro", "v2ProPlus")  # SoVITS families that also condition on the speaker-verification features
# The extra SoVITS weights of v2Pro/v2ProPlus (upstream ``is_v2pro``): sv_emb Linear, PReLU, ge_to512 Linear.
V2PRO_KEYS = ("sv_emb.weight", "sv_emb.bias", "prelu.weight", "ge_to512.weight", "ge_to512.bias")
V2PRO_PLUS_FIRST_KERNEL = 20  # v2ProPlus's first HiFi-GAN upsampling kernel (v2/v2Pro: 16)
V2_SYMBOLS = 732  # phone table size of v2 (text/symbols2.py)
V1_SYMBOLS = 322  # phone table size of v1 (SoVITS text embedding rows)
V1_GPT_PHONEMES = 512  # phoneme_vocab_size of v1 GPT files
SUPPORTED_HINT = "use a v2, v2Pro or v2ProPlus model"  # what every refusal of another family says instead
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
        the model family: ``"v2"``, ``"v2Pro"`` or ``"v2ProPlus"`` (from the file's 2-byte tag, else from its
        weights and config).
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
    if not is_dict(obj):
        raise ModelFormatError(f"{path}: not a GPT-SoVITS GPT checkpoint (top level is {type(obj).__name__}).")
    weights = obj.get("weight")
    if weights is None:
        weights = obj.get("state_dict")  # a raw Lightning training checkpoint
    config = obj.get("config")
    if not is_dict(weights) or not is_dict(config):
        if isinstance(config, HParams) or _looks_like_sovits(weights):
            raise ModelFormatError(
                f"{path}: this is a SoVITS model (.pth), not a GPT model (.ckpt); "
                f"swap the two paths."
            )
        raise ModelFormatError(
            f"{path}: not a GPT-SoVITS GPT checkpoint (expected 'weight' and 'config' entries, found {sorted(obj)})."
        )
    model_cfg = config.get("model")
    if not is_dict(model_cfg):
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
            f"v1 is not supported; {SUPPORTED_HINT}."
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
    """Load a GPT-SoVITS v2, v2Pro or v2ProPlus SoVITS ``.pth`` without running any code from it.

    The pickled ``utils.HParams`` config of fine-tuned files is accepted and returned as nested dicts. The family
    comes from the file's 2-byte tag (``01`` v2, ``05`` v2Pro, ``06`` v2ProPlus; restored to ``PK`` in memory only);
    an untagged file with the v2Pro weights (``sv_emb``, ``prelu``, ``ge_to512``) is v2Pro or v2ProPlus by its
    config's ``version`` or, failing that, by its first upsampling kernel. v3/v4 (LoRA or full) and v1 models are
    recognised and refused.

    Parameters
    ----------
    path:
        the ``.pth`` file (upstream ``process_ckpt.savee`` format, or a pretrained ``s2G*.pth``).

    Raises
    ------
    ModelFormatError
        unreadable, unsafe (contains code), not a v2/v2Pro/v2ProPlus SoVITS file, or tagged as one family while
        its weights are of another; the message names the file and the fix.
    """
    path = Path(path)
    tag = _version_tag(path)
    obj = _load_torch_file(path, kind="SoVITS")
    if not is_dict(obj):
        raise ModelFormatError(f"{path}: not a GPT-SoVITS SoVITS checkpoint (top level is {type(obj).__name__}).")
    weights = obj.get("weight")
    if not is_dict(weights):
        raise ModelFormatError(
            f"{path}: not a GPT-SoVITS SoVITS checkpoint (expected a 'weight' entry, found {sorted(map(str, obj))})."
        )
    state_dict = {str(k): v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    if any(k.startswith("model.ar_") or k.startswith("ar_") for k in state_dict):
        raise ModelFormatError(f"{path}: this is a GPT model (.ckpt), not a SoVITS model (.pth); swap the two paths.")
    if "lora_rank" in obj:
        raise ModelFormatError(f"{path}: v3/v4 LoRA files are not supported yet; {SUPPORTED_HINT}.")
    if any(k.startswith("cfm.") for k in state_dict):
        raise ModelFormatError(f"{path}: v3/v4 SoVITS models are not supported yet; {SUPPORTED_HINT}.")
    emb = state_dict.get("enc_p.text_embedding.weight")
    if emb is None:
        raise ModelFormatError(
            f"{path}: SoVITS checkpoint lacks 'enc_p.text_embedding.weight'; "
            f"the file is incomplete."
        )
    if emb.shape[0] == V1_SYMBOLS:
        raise ModelFormatError(
            f"{path}: this is a GPT-SoVITS v1 SoVITS model (322 symbols); "
            f"v1 is not supported; {SUPPORTED_HINT}."
        )
    if emb.shape[0] != V2_SYMBOLS:
        raise ModelFormatError(
            f"{path}: SoVITS text embedding has {emb.shape[0]} symbols, expected {V2_SYMBOLS} (v2); "
            f"{SUPPORTED_HINT}."
        )
    config = _to_plain(obj.get("config", {}))
    if not is_dict(config) or not is_dict(config.get("model")):
        raise ModelFormatError(
            f"{path}: SoVITS checkpoint has no 'model' section in its config; "
            f"re-export it with GPT-SoVITS."
        )
    version = _sovits_version(path, tag, state_dict, config)
    info = str(obj.get("info", ""))
    log.debug("loaded %s SoVITS checkpoint %s (%d tensors, info %r)", version, path, len(state_dict), info)
    return SovitsCheckpoint(state_dict=state_dict, config=config, version=version, info=info)


@dataclass(frozen=True)
class SvCheckpoint:
    """The speaker-verification model of v2Pro/v2ProPlus (an ERes2NetV2 ``state_dict``).

    Attributes
    ----------
    state_dict:
        parameter/buffer name -> tensor, dtype as stored (fp16 floats in the released file is likely; BatchNorm
        ``num_batches_tracked`` int64).
    m_channels:
        the stem width, ``conv1.weight.shape[0]`` (64 in the released model); every other size follows from it.
    """

    state_dict: dict[str, torch.Tensor]
    m_channels: int


def load_sv_checkpoint(path: str | os.PathLike[str]) -> SvCheckpoint:
    """Load the ERes2NetV2 speaker-verification weights (upstream ``sv/pretrained_eres2netv2w24s4ep4.ckpt``).

    The file is a plain ``state_dict``; it is read with torch's weights-only unpickler (upstream uses
    ``weights_only=False``; nothing here runs code from the file). Only names and shapes are checked here; the model
    builder (:mod:`engines.gpt_sovits.sv`) checks the full key/shape set against the architecture.

    Raises
    ------
    ModelFormatError
        unreadable, unsafe, or not an ERes2NetV2 state dict; the message names the file and the fix.
    """
    path = Path(path)
    obj: Any = _load_torch_file(path, kind="speaker-verification (SV)")
    if is_dict(obj) and is_dict(obj.get("weight")):  # a GPT or SoVITS file body
        raise ModelFormatError(f"{path}: this is a GPT-SoVITS model, not the speaker-verification model; "
                               "point models.sv at sv/pretrained_eres2netv2w24s4ep4.ckpt.")
    if is_dict(obj) and is_dict(obj.get("state_dict")):
        obj = obj["state_dict"]  # a training checkpoint wrapping the weights
    if not is_dict(obj) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelFormatError(
            f"{path}: not a speaker-verification model (expected a state dict of tensors, found "
            f"{type(obj).__name__}); download sv/pretrained_eres2netv2w24s4ep4.ckpt again."
        )
    state_dict: dict[str, torch.Tensor] = {str(k): v for k, v in cast("dict[Any, torch.Tensor]", obj).items()}
    conv1 = state_dict.get("conv1.weight")
    if conv1 is None or conv1.dim() != 4 or "fuse34.local_att.0.weight" not in state_dict:
        raise ModelFormatError(
            f"{path}: not an ERes2NetV2 speaker-verification model (no conv1/fuse34 weights); "
            "download sv/pretrained_eres2netv2w24s4ep4.ckpt again."
        )
    log.debug("loaded SV checkpoint %s (%d tensors, m_channels %d)", path, len(state_dict), conv1.shape[0])
    return SvCheckpoint(state_dict=state_dict, m_channels=int(conv1.shape[0]))


def _version_tag(path: Path) -> str | None:
    """The family named by a SoVITS file's 2-byte tag, or None for an untagged (``PK``) or unreadable file."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return None  # _load_torch_file reports it
    entry = VERSION_MAGICS.get(head)
    return entry[0] if entry is not None else None


def _sovits_version(path: Path, tag: str | None, state_dict: dict[str, torch.Tensor], config: dict[str, Any]) -> str:
    """The SoVITS family from the tag, checked against the weights (a mis-tagged file is refused, never guessed)."""
    present = [k for k in V2PRO_KEYS if k in state_dict]
    if tag in V2PRO_VERSIONS:
        if len(present) < len(V2PRO_KEYS):
            missing = [k for k in V2PRO_KEYS if k not in state_dict]
            raise ModelFormatError(
                f"{path}: tagged as a {tag} file but it lacks the {tag} weights {', '.join(missing)}; "
                "the file is damaged or mis-tagged, download or export it again."
            )
        return tag
    if not present:
        return "v2"
    if len(present) < len(V2PRO_KEYS):
        missing = [k for k in V2PRO_KEYS if k not in state_dict]
        raise ModelFormatError(
            f"{path}: has some v2Pro weights ({', '.join(present)}) but lacks {', '.join(missing)}; "
            "the file is incomplete, download or export it again."
        )
    if tag == "v2":
        raise ModelFormatError(
            f"{path}: tagged as a v2 file but it holds v2Pro weights (sv_emb, prelu, ge_to512); "
            "the file is mis-tagged, export it again with GPT-SoVITS."
        )
    stated = str(config.get("model", {}).get("version", ""))
    if stated in V2PRO_VERSIONS:
        return stated
    # An untagged file (e.g. a pretrained s2Gv2Pro*.pth) whose config does not say: v2ProPlus is the one with the
    # wider first upsampling kernel; the model itself is built from the config and shapes either way.
    up0 = state_dict.get("dec.ups.0.weight_v", state_dict.get("dec.ups.0.weight"))
    plus = up0 is not None and up0.dim() == 3 and up0.shape[-1] == V2PRO_PLUS_FIRST_KERNEL
    return "v2ProPlus" if plus else "v2Pro"


_fingerprints: dict[tuple[str, int, int], str] = {}
_fingerprints_lock = threading.Lock()


def tagged_checkpoint(ckpt: dict[str, Any], tag: bytes | None) -> bytes:
    """``ckpt`` as upstream's ``my_save2`` writes it: torch's zip with its ``PK`` replaced by the 2-byte version
    ``tag`` (None: the plain zip, as ``torch.save`` writes it)."""
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    data = buf.getvalue()
    return data if tag is None else tag + data[len(ZIP_MAGIC):]


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


def require_model_files(models: Any) -> None:
    """The GPT and SoVITS files of ``models`` (a :class:`~engines.base.ModelPaths`) exist, or an error with the fix."""
    for label, path in (("GPT", models.gpt), ("SoVITS", models.sovits)):
        if not Path(path).is_file():
            raise EngineError(f"the {label} model file {path} does not exist: run `python -m bot models download`, "
                              f"or point models.{label.lower()} in config.yaml at your file")


def model_id(models: Any, *more: str) -> str:
    """The id of what a model pair computes (16 hex digits): a hash of the GPT's and the SoVITS's fingerprints and
    ``more`` (another file's fingerprint that changes the output, or a format version)."""
    ident = ":".join([file_fingerprint(models.gpt), file_fingerprint(models.sovits), *more])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _load_torch_file(path: Path, kind: str, accept: Collection[bytes] = ()) -> Any:
    """Open a torch checkpoint safely: check the magic, then unpickle with the weights-only unpickler.

    ``accept``: version tags this caller reads (besides the supported v2 ones); the diffusion families' loader
    (:mod:`engines.gpt_sovits.dit_checkpoint`) passes theirs."""
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
        if not supported and head not in accept:
            raise ModelFormatError(f"{path}: {name} files are not supported yet; {SUPPORTED_HINT}.")
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
        raise ModelFormatError(f"{path} is truncated or corrupt ({_brief(e)}); download it again.") from e


def _brief(e: BaseException) -> str:
    """The first sentence of a backend error (torch's zip errors run to several), for a one-line message."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(". ")[0][:160]


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


def is_dict(value: object) -> TypeGuard[dict[Any, Any]]:
    """``isinstance(value, dict)``, for the untyped contents of an unpickled checkpoint (keys and values: Any)."""
    return isinstance(value, dict)


def _strip_prefix(name: str) -> str:
    """Drop the Lightning module prefix ``model.`` from a GPT parameter name."""
    return name[len("model.") :] if name.startswith("model.") else name


def _looks_like_sovits(weights: object) -> bool:
    """True if a weight dict has SoVITS parameter names."""
    return is_dict(weights) and any(str(k).startswith("enc_p.") for k in weights)


def _to_plain(value: Any) -> Any:
    """Turn HParams and OrderedDicts into nested plain dicts/lists."""
    if isinstance(value, HParams):
        value = value.__dict__
    if is_dict(value):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in cast("Sequence[Any]", value)]
    return value
