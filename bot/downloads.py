"""Downloading the pretrained GPT-SoVITS v2 model set: progress, resume, SHA-256 check, configurable mirror."""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm import tqdm

from synthesis import SpeechError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # 1 MiB per read
TIMEOUT_S = 60.0  # socket timeout per read


class DownloadError(SpeechError):
    """A model file could not be downloaded or failed its checksum."""


@dataclass(frozen=True)
class ModelFile:
    path: str  # path under the base URL and under the models folder
    sha256: str | None  # None: no published checksum (size is still checked when known)
    size: int | None = None  # bytes


# The official v2 inference set (HF lj1995/GPT-SoVITS); checksums from the reference notes.
V2_MODEL_SET: tuple[ModelFile, ...] = (
    ModelFile("gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
              "732f94e63b148066e24c7f9d2637f3374083e637635f07fbdb695dee20ddbe1f", 155_315_150),
    ModelFile("gsv-v2final-pretrained/s2G2333k.pth",
              "924fdccaa3c574bf139c25c9759aa1ed3b3f99e19a7c529ee996c2bc17663695", 106_035_259),
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
    checked against its SHA-256 (and size) before it is renamed into place, so a file at its final path is
    always complete. Returns the paths written.
    """
    written: list[Path] = []
    todo = missing_files(dest, files)
    if not todo:
        log.info("all %d model files present in %s", len(files), dest)
        return written
    for f in todo:
        written.append(_download_one(dest, base_url, f, progress=progress, opener=opener or urllib.request.urlopen))
    return written


def _download_one(dest: Path, base_url: str, f: ModelFile, *, progress: bool, opener: Callable[..., object]) -> Path:
    """Fetch one file with resume; verify; rename into place."""
    target = dest / f.path
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    url = file_url(base_url, f.path)
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
                                f"Check models.download_base_url in config.yaml (a mirror may help)") from e
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"cannot reach {url}: {e}. Check your connection or set models.download_base_url "
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
    os.replace(part, target)
    log.info("downloaded %s (%d bytes)", f.path, size)
    return target
