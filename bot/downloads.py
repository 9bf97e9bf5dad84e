"""Downloading a pretrained GPT-SoVITS model set (v2, v2Pro, v2ProPlus, v4, v5turbo, v5dev, v3): progress,
resume, checks, a mirror.

A file with a published SHA-256 (the v2 set) is checked against it. Upstream publishes none for the later files, so
none is invented here: ``s1v3.ckpt`` and the v5 SoVITS files are checked by their sizes, and the v2Pro/v2ProPlus/v4/v5
SoVITS, the SV model and the vocoders by their tensors' names and shapes, read from the file without torch and without running anything from it, against those of
upstream's released files (:data:`SHAPES`).

The text front-end's optional files come the same way (:func:`download_frontend_files`): upstream's English
dictionaries by SHA-256, the G2PW model (no published checksum) by its unpacked files and its ONNX model loading.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, NamedTuple, Sequence

from synthesis import SpeechError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # 1 MiB per read
TIMEOUT_S = 60.0  # socket timeout per read


class DownloadError(SpeechError):
    """A model file could not be downloaded or failed its check (checksum, size, or tensor names and shapes)."""


@dataclass(frozen=True)
class ShapeCheck:
    """What a file without a published checksum must hold: its tensors' names and shapes, as a count and a digest.

    Tensors of the training-only posterior encoder (``enc_q.*``, in pretrained SoVITS files, not in fine-tuned
    ones) and BatchNorm step counters (``*.num_batches_tracked``) are left out: inference uses neither.
    """

    tensors: int
    digest: str  # shape_digest() of the other tensors


@dataclass(frozen=True)
class ModelFile:
    path: str  # path under the base URL and under the models folder
    sha256: str | None  # None: no published checksum (size is still checked when known)
    size: int | None = None  # bytes
    shapes: ShapeCheck | None = None  # checked when there is no checksum to check


# The released v2Pro/v2ProPlus SoVITS and SV files' tensors (names and shapes of upstream's classes at released size,
# tests/data/golden-v2pro/real_size_shapes.json; tests/bot/test_downloads.py recomputes these from it).
SHAPES = {
    "sovits_v2Pro": ShapeCheck(678, "2eecaba19ff3e6cb2f72007b7db48b444e53e56592260b890a46916fe179d08c"),
    "sovits_v2ProPlus": ShapeCheck(678, "9076dfb75834294fc10a765506e63c2f3bf1228975c2567b3dca339a26fce9b0"),
    "sv": ShapeCheck(844, "507bec466501edd87a58d8a6c5a0ae99041b7d3378fc590ce4c51dd3740814b6"),
    # v4/v5 (tests/data/golden-v4v5/real_size_shapes.json): the v4 SoVITS (a DiT with the step embedding), the v5
    # one (without), and the 48 kHz vocoder both use
    "sovits_v4": ShapeCheck(685, "73e5409ae1edaea235f4277eef9e0285f847aa0e80085f5b2535c6df4e40e7c9"),
    "sovits_v5": ShapeCheck(681, "77f31a6681f168c1a145c682c45dabc02d5088edd1b31825221c9a860b930665"),
    "vocoder48k": ShapeCheck(194, "6ff566f19dbe7d179c8638b977a40de3b50110c85db511d657006c957f5a6c31"),
    "bigvgan": ShapeCheck(783, "24b91a562a7f51a37a65e7b64fdd096878fc07661d44f050ffdabfcdbb08d005"),  # weight norm kept
}

# Upstream's pretrained files (HF lj1995/GPT-SoVITS); the v2 checksums are from the reference notes.
V2_GPT = ModelFile("gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
                   "732f94e63b148066e24c7f9d2637f3374083e637635f07fbdb695dee20ddbe1f", 155_315_150)
V2_SOVITS = ModelFile("gsv-v2final-pretrained/s2G2333k.pth",
                      "924fdccaa3c574bf139c25c9759aa1ed3b3f99e19a7c529ee996c2bc17663695", 106_035_259)
V3_GPT = ModelFile("s1v3.ckpt", None, 155_284_856)  # the GPT of v2Pro/v2ProPlus (a v2 GPT, trained further)
V2PRO_SOVITS = ModelFile("v2Pro/s2Gv2Pro.pth", None, shapes=SHAPES["sovits_v2Pro"])
V2PROPLUS_SOVITS = ModelFile("v2Pro/s2Gv2ProPlus.pth", None, shapes=SHAPES["sovits_v2ProPlus"])
SV_MODEL = ModelFile("sv/pretrained_eres2netv2w24s4ep4.ckpt", None, shapes=SHAPES["sv"])
# v4 and v5: no published checksum and (but for the v5 SoVITS) no published size; their tensors are checked
V4_SOVITS = ModelFile("gsv-v4-pretrained/s2Gv4.pth", None, shapes=SHAPES["sovits_v4"])
V4_VOCODER = ModelFile("gsv-v4-pretrained/vocoder.pth", None, shapes=SHAPES["vocoder48k"])
V5DEV_SOVITS = ModelFile("gsv-v5-pretrained/s2Gv5dev.pth", None, 766_406_144, shapes=SHAPES["sovits_v5"])
V5TURBO_SOVITS = ModelFile("gsv-v5-pretrained/s2Gv5turbo.pth", None, 766_406_144, shapes=SHAPES["sovits_v5"])
V5_VOCODER = ModelFile("gsv-v5-pretrained/vocoder.pth", None, shapes=SHAPES["vocoder48k"])
V3_SOVITS = ModelFile("s2Gv3.pth", None, 769_035_145, shapes=SHAPES["sovits_v4"])  # the v4 tensors, as released
BIGVGAN_FOLDER = "models--nvidia--bigvgan_v2_24khz_100band_256x"  # v3's vocoder: NVIDIA's BigVGAN v2 24 kHz
BIGVGAN = (ModelFile(f"{BIGVGAN_FOLDER}/bigvgan_generator.pt", None, shapes=SHAPES["bigvgan"]),
           # no published size or checksum: the loader reads it as JSON and checks its keys at start-up
           ModelFile(f"{BIGVGAN_FOLDER}/config.json", None))
ENCODERS: tuple[ModelFile, ...] = (  # HuBERT (every family) and the Chinese BERT (zh text)
    ModelFile("chinese-hubert-base/pytorch_model.bin",
              "24164f129c66499d1346e2aa55f183250c223161ec2770c0da3d3b08cf432d3c"),
    ModelFile("chinese-hubert-base/config.json",
              "c3e5060a1277e0f078cc6be9da4528a605dba6ece93018981fe2c820e5c7b103"),
    ModelFile("chinese-hubert-base/preprocessor_config.json",
              "dcd684124d06722947939d41ea6ae58dbf10968c60a11a29f23ddc602c64a29b"),
    ModelFile("chinese-roberta-wwm-ext-large/pytorch_model.bin",
              "e53a693acc59ace251d143d068096ae0d7b79e4b1b503fa84c9dcf576448c1d8"),
    ModelFile("chinese-roberta-wwm-ext-large/config.json",
              "3d57de2fd7e80d0e5c8ff194f0bbb6baa10df7e43fc262a0cc71298a78b0a3e5"),
    ModelFile("chinese-roberta-wwm-ext-large/tokenizer.json",
              "173796956820ea27bd14f76bf28162607ff4254807e2948253eb5b46f5bb643b"),
)


@dataclass(frozen=True)
class ModelSet:
    """One family's pretrained files: its GPT, its SoVITS, what else its SoVITS needs (the SV model, or a diffusion
    family's vocoder), the encoders."""

    gpt: ModelFile
    sovits: ModelFile
    extra: tuple[ModelFile, ...] = ()
    vocoder: str | None = None  # v3/v4/v5: the vocoder's file (v3: folder) under the models folder, from extra

    def files(self, *, gpt: bool = True, sovits: bool = True) -> tuple[ModelFile, ...]:
        """The files to fetch; ``gpt``/``sovits`` False leaves out a pretrained file replaced by the user's own."""
        return (*([self.gpt] if gpt else []), *([self.sovits] if sovits else []), *self.extra, *ENCODERS)


MODEL_SETS = {  # config models.family -> its pretrained set
    "v2": ModelSet(V2_GPT, V2_SOVITS),
    "v2Pro": ModelSet(V3_GPT, V2PRO_SOVITS, (SV_MODEL,)),
    "v2ProPlus": ModelSet(V3_GPT, V2PROPLUS_SOVITS, (SV_MODEL,)),
    "v4": ModelSet(V3_GPT, V4_SOVITS, (V4_VOCODER,), V4_VOCODER.path),
    "v5turbo": ModelSet(V3_GPT, V5TURBO_SOVITS, (V5_VOCODER,), V5_VOCODER.path),
    "v5dev": ModelSet(V3_GPT, V5DEV_SOVITS, (V5_VOCODER,), V5_VOCODER.path),
    "v3": ModelSet(V3_GPT, V3_SOVITS, BIGVGAN, BIGVGAN_FOLDER),
}
DEFAULT_FAMILY = "v2"
V2_MODEL_SET = MODEL_SETS["v2"].files()


def file_url(base_url: str, path: str) -> str:
    """``base_url/path`` with each path segment percent-encoded (``=`` becomes ``%3D``)."""
    quoted = "/".join(urllib.parse.quote(part, safe="") for part in path.split("/"))
    return base_url.rstrip("/") + "/" + quoted


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK_BYTES):
            h.update(block)
    return h.hexdigest()


def missing_files(dest: Path, files: Sequence[ModelFile] = V2_MODEL_SET) -> list[ModelFile]:
    """The files not yet present (a present file is trusted; `download` verifies what it writes)."""
    return [f for f in files if not (dest / f.path).is_file()]


def download_models(
    dest: Path,
    base_url: str,
    files: Sequence[ModelFile] = V2_MODEL_SET,
    *,
    progress: bool = True,
    opener: Callable[..., object] | None = None,
) -> list[Path]:
    """Download every missing file of ``files`` into ``dest``, resuming partial downloads.

    A partial download lives in ``<file>.part`` and is continued with an HTTP Range request; the finished file is
    checked (its SHA-256 where one is published, its size where known, else its tensors' names and shapes where
    :attr:`ModelFile.shapes` gives them) before it is renamed into place, so a file at its final path is always
    complete. Returns the paths written.
    """
    written: list[Path] = []
    todo = missing_files(dest, files)
    if not todo:
        log.info("all %d model files present in %s", len(files), dest)
        return written
    for f in todo:
        written.append(_download_one(dest, file_url(base_url, f.path), f, progress=progress,
                                     opener=opener or urllib.request.urlopen))
    return written


def _download_one(dest: Path, url: str, f: ModelFile, *, progress: bool, opener: Callable[..., object],
                  setting: str = "models.download_base_url") -> Path:
    """Fetch one file from ``url`` into ``dest / f.path`` with resume; verify; rename into place (``setting``: the
    config key an error message names)."""
    from tqdm import tqdm  # the progress bar loads with the first download, not with the config
    target = dest / f.path
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if f.size is not None and have > f.size:
        part.unlink()
        have = 0
    request = urllib.request.Request(url, headers={"User-Agent": "voicebot"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = opener(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # already complete
            response = None
        else:
            raise DownloadError(f"downloading {f.path} from {url} failed: HTTP {e.code} {e.reason}. "
                                f"Check {setting} in config.yaml (a mirror may help)") from e
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"cannot reach {url}: {e}. Check your connection or set {setting} "
                            f"to a reachable mirror; the download resumes where it stopped") from e
    if response is not None:
        with response:  # type: ignore[attr-defined]
            status = getattr(response, "status", 200)
            if have and status != 206:  # server ignored the Range header: start over
                have = 0
            length = response.headers.get("Content-Length")  # type: ignore[attr-defined]
            total = (have + int(length)) if length is not None else f.size
            mode = "ab" if have else "wb"
            with part.open(mode) as out, tqdm(total=total, initial=have, unit="B", unit_scale=True,
                                                unit_divisor=1024, desc=f.path.rsplit("/", 1)[-1],
                                                disable=not progress, leave=False) as bar:
                try:
                    while block := response.read(CHUNK_BYTES):  # type: ignore[attr-defined]
                        out.write(block)
                        bar.update(len(block))
                except (OSError, urllib.error.URLError) as e:
                    raise DownloadError(f"download of {f.path} interrupted: {e}. Run the same command again "
                                        f"to resume") from e
    size = part.stat().st_size
    if f.size is not None and size != f.size:
        raise DownloadError(f"{f.path}: got {size} bytes, expected {f.size}; run again to resume or delete {part}")
    if f.sha256 is not None:
        digest = sha256_of(part)
        if digest != f.sha256:
            part.unlink()
            raise DownloadError(f"{f.path}: SHA-256 mismatch (expected {f.sha256}, got {digest}); the partial file "
                                f"was removed, run again to download it afresh (or check your mirror)")
    if f.sha256 is None and f.shapes is not None:
        _check_shapes(part, f)
    os.replace(part, target)
    log.info("downloaded %s (%d bytes)", f.path, size)
    return target



# ---- the text front-end's optional files: upstream's English dictionaries and its G2PW model -----------------------

UPSTREAM_COMMIT = "48b1a0169a28582a8984402f82cf438d3bfa6aca"  # the GPT-SoVITS commit whose text files are pinned
TEXT_BASE_URL = f"https://raw.githubusercontent.com/RVC-Boss/GPT-SoVITS/{UPSTREAM_COMMIT}/GPT_SoVITS/text"
G2PW_URL = "https://huggingface.co/XXXXRT/GPT-SoVITS-Pretrained/resolve/main/G2PWModel.zip"  # as install.sh names it
TEXT_DIR = "gpt-sovits-text"  # under models.dir: upstream's English dictionaries
G2PW_DIR = "G2PWModel"  # under models.dir: the unpacked G2PW model, with upstream's correction tables beside it
# Upstream's English front-end files at UPSTREAM_COMMIT (their SHA-256 and sizes in its repository).
ENGLISH_FILES = (
    ModelFile("cmudict.rep", "0e601d017d6e6f958443d41cd8922b4cd7598b3ba2056253a33f3e5a35f38494", 3_731_285),
    ModelFile("cmudict-fast.rep", "53bfef0f27d7dd74d1ba74563d1e076d3e0672ce3596cb2d6c0d52ac9ad01f6d", 3_613_898),
    ModelFile("engdict-hot.rep", "1c80418fe6fe5d537302ae67afd3612478997b35f2cf37cff52f959ed4334a71", 75),
    ModelFile("namedict_cache.pickle", "559552094c4a6e995213e3fa586330e078ef8cb3a7a95a3109e945111cd2bfc1", 760_663),
)
# Upstream's G2PW corrections (text/g2pw/ at UPSTREAM_COMMIT), read by synthesis from the model's folder.
G2PW_CORRECTIONS = (
    ModelFile("polyphonic.rep", "a8f13e2004702cbbf01e2e3fe8436d9d620a0fe4d57176a844704619ffd5df5e", 1_391),
    ModelFile("polyphonic-fix.rep", "bbfac0e43e5b1db56566e5eb8b147f7e9b57175e07ffe6303195ee6563682f6b", 1_660_967),
)
G2PW_ONNX = ("g2pW.onnx", "g2pw.onnx")  # either spelling, as upstream looks for both
G2PW_TABLES = ("config.py", "POLYPHONIC_CHARS.txt", "MONOPHONIC_CHARS.txt", "bopomofo_to_pinyin_wo_tune_dict.json")


class FrontendFiles(NamedTuple):
    """What :func:`download_frontend_files` did: the paths written, and one line per part that could not be had."""

    written: list[Path]
    failed: list[str]


def english_installed(folder: Path) -> bool:
    """Whether ``folder`` holds upstream's English dictionaries (all four files)."""
    return not missing_files(folder, ENGLISH_FILES)


def g2pw_installed(folder: Path) -> bool:
    """Whether ``folder`` holds an unpacked G2PW model (its ONNX file and its tables)."""
    return (any((folder / n).is_file() for n in G2PW_ONNX)
            and all((folder / n).is_file() for n in G2PW_TABLES))


def download_frontend_files(
    models_dir: Path,
    text_base_url: str = TEXT_BASE_URL,
    g2pw_url: str = G2PW_URL,
    *,
    progress: bool = True,
    opener: Callable[..., object] | None = None,
) -> FrontendFiles:
    """Fetch the text front-end's optional files into ``models_dir``: never raises for them, speech works without.

    Upstream's English dictionaries go to ``TEXT_DIR`` (checked by SHA-256 and size, as the model files are). The
    G2PW archive (no published checksum) is unpacked beside ``G2PW_DIR`` and renamed into place only once its files
    are all there and its ONNX model loads; upstream's correction tables follow it into that folder. A part that
    fails is reported in :attr:`FrontendFiles.failed` and left to the next run (downloads resume).
    """
    opener = opener or urllib.request.urlopen
    out = FrontendFiles([], [])
    text_dir = models_dir / TEXT_DIR
    try:
        for f in missing_files(text_dir, ENGLISH_FILES):
            out.written.append(_download_one(text_dir, file_url(text_base_url, f.path), f, progress=progress,
                                             opener=opener, setting="models.text_base_url"))
    except DownloadError as e:
        out.failed.append(f"upstream's English dictionaries: {e}")
    try:
        out.written.extend(_install_g2pw(models_dir, text_base_url, g2pw_url, progress=progress, opener=opener))
    except DownloadError as e:
        out.failed.append(f"the G2PW model: {e}")
    return out


def _install_g2pw(models_dir: Path, text_base_url: str, g2pw_url: str, *, progress: bool,
                  opener: Callable[..., object]) -> list[Path]:
    """The G2PW model (downloaded, unpacked, checked) and then its correction tables."""
    target = models_dir / G2PW_DIR
    written: list[Path] = []
    if not g2pw_installed(target):
        if target.exists():
            raise DownloadError(f"{target} exists but holds no complete G2PW model; remove it and run again")
        archive = models_dir / (G2PW_DIR + ".zip")
        if not archive.is_file():  # else a run that stopped while unpacking left it: unpack it again
            _download_one(models_dir, g2pw_url, ModelFile(archive.name, None), progress=progress, opener=opener,
                          setting="models.g2pw_url")
        _unpack_g2pw(archive, target)
        written.append(target)
    for f in missing_files(target, G2PW_CORRECTIONS):
        written.append(_download_one(target, file_url(text_base_url, "g2pw/" + f.path), f, progress=progress,
                                     opener=opener, setting="models.text_base_url"))
    return written


def _unpack_g2pw(archive: Path, target: Path) -> None:
    """Unpack into a folder beside ``target``, check it, rename it into place; a bad archive is removed."""
    staging = target.with_name(target.name + ".unpacking")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive) as z:
            _extract(z, staging)
        check_g2pw_folder(staging)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        archive.unlink(missing_ok=True)
        raise DownloadError(f"{archive.name} is not a usable G2PW model ({e}); it was removed: run again to "
                            f"download it afresh, or check models.g2pw_url") from e
    os.replace(staging, target)
    archive.unlink()
    log.info("unpacked the G2PW model into %s", target)


def _extract(z: zipfile.ZipFile, folder: Path) -> None:
    """The archive's files into ``folder``, its one top folder (``G2PWModel/``) stripped; unsafe names refused."""
    members = [m for m in z.infolist() if not m.is_dir() and not m.filename.startswith("__MACOSX/")]
    parts = [PurePosixPath(m.filename).parts for m in members]
    for name, p in zip(members, parts):
        if not p or p[0].startswith("/") or ".." in p or ":" in p[0]:
            raise ValueError(f"unsafe name {name.filename!r} inside")
    tops = {p[0] for p in parts if len(p) > 1}
    strip = 1 if len(tops) == 1 and all(len(p) > 1 for p in parts) else 0
    for member, p in zip(members, parts):
        dest = folder.joinpath(*p[strip:])
        dest.parent.mkdir(parents=True, exist_ok=True)
        with z.open(member) as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, CHUNK_BYTES)


def check_g2pw_folder(folder: Path) -> None:
    """Raise ValueError unless ``folder`` holds every file synthesis reads and its ONNX model loads."""
    onnx_path = next((folder / n for n in G2PW_ONNX if (folder / n).is_file()), None)
    missing = ([] if onnx_path else [G2PW_ONNX[0]]) + [n for n in G2PW_TABLES if not (folder / n).is_file()]
    if onnx_path is None or missing:
        raise ValueError(f"{', '.join(missing)} missing from it")
    import onnx  # loaded for this check only

    try:
        onnx.checker.check_model(str(onnx_path))  # parses the file and checks the graph (a path: any size)
    except Exception as e:  # onnx raises its own checker and protobuf errors, which share no base
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{onnx_path.name} does not load as an ONNX model: {first}") from e

# ---- names and shapes of a checkpoint's tensors, without torch ------------------------------------------------------


class _Tensor(NamedTuple):
    shape: tuple[int, ...]


class _Opaque:
    """Stands in for any other class named in the pickle (HParams, storages): nothing is imported or run."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass


def _rebuild_tensor(storage: object, offset: object, size: Sequence[int], *rest: object) -> _Tensor:
    return _Tensor(tuple(int(n) for n in size))


_TENSOR_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): lambda data, *rest: data,
    ("torch._utils", "_rebuild_parameter_with_state"): lambda data, *rest: data,
    ("torch._tensor", "_rebuild_from_type_v2"): lambda func, new_type, args, state: func(*args),
    ("collections", "OrderedDict"): OrderedDict,
}


class _ShapeUnpickler(pickle.Unpickler):
    """Unpickles a torch checkpoint's structure: tensors become their shapes, every other class an inert stub."""

    def find_class(self, module: str, name: str) -> Any:
        return _TENSOR_GLOBALS.get((module, name), _Opaque)

    def persistent_load(self, pid: object) -> None:
        return None  # a storage: its bytes are never read


class _ZipMagic(io.RawIOBase):
    """A file read with its first two bytes as ``PK``: upstream's v2Pro version tag (``05``/``06``) undone."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, buffer: Any) -> int:
        pos = self._f.tell()
        n = self._f.readinto(buffer)  # type: ignore[attr-defined]
        for i in range(pos, min(2, pos + n)):
            buffer[i - pos] = b"PK"[i]
        return n


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a checkpoint's weights (a SoVITS file's ``weight``, or a plain state dict).

    Reads torch's zip format (version-tagged or not) and its legacy format; raises ValueError when the file is
    neither.
    """
    with path.open("rb") as f:
        head = f.read(2)
        f.seek(0)
        try:
            if head[:1] == b"\x80":  # legacy format: magic number, protocol, system info, then the object
                for _ in range(3):
                    pickle.Unpickler(f).load()
                obj = _ShapeUnpickler(f).load()
            else:
                with zipfile.ZipFile(_ZipMagic(f)) as z:  # type: ignore[arg-type]
                    pkl = [n for n in z.namelist() if n.endswith("data.pkl")]
                    if not pkl:
                        raise ValueError("no data.pkl inside")
                    obj = _ShapeUnpickler(io.BytesIO(z.read(pkl[0]))).load()
        except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, TypeError, AttributeError, IndexError) as e:
            raise ValueError(f"not a PyTorch checkpoint ({e})") from e
    if isinstance(obj, dict):
        for wrapper in ("weight", "state_dict", "generator"):  # a SoVITS, a state dict, BigVGAN's generator
            if isinstance(obj.get(wrapper), dict):
                obj = obj[wrapper]
                break
    if not isinstance(obj, dict):
        raise ValueError(f"not a checkpoint of named tensors (top level is {type(obj).__name__})")
    return {str(k): v.shape for k, v in obj.items() if isinstance(v, _Tensor)}


def shape_digest(shapes: dict[str, tuple[int, ...]]) -> ShapeCheck:
    """The :class:`ShapeCheck` of a name -> shape table (``enc_q.*`` and ``num_batches_tracked`` left out)."""
    kept = sorted((k, v) for k, v in shapes.items()
                  if not k.startswith("enc_q.") and not k.endswith("num_batches_tracked"))
    text = "\n".join(f"{k} {'x'.join(map(str, v))}" for k, v in kept)
    return ShapeCheck(len(kept), hashlib.sha256(text.encode()).hexdigest())


def _check_shapes(part: Path, f: ModelFile) -> None:
    """Refuse (and remove) a downloaded file whose tensors are not those of upstream's released file."""
    assert f.shapes is not None
    try:
        got = shape_digest(tensor_shapes(part))
    except (ValueError, OSError) as e:
        part.unlink()
        raise DownloadError(f"{f.path}: {e}; the partial file was removed. Check models.download_base_url (a "
                            f"mirror may have served an error page)") from e
    if got != f.shapes:
        part.unlink()
        raise DownloadError(
            f"{f.path}: its tensors are not those of upstream's released file ({got.tensors} checked tensors, "
            f"expected {f.shapes.tensors}, or other shapes); it was removed. Check models.download_base_url; a file "
            f"you trust can be put at its place by hand (a present file is not checked again)")
