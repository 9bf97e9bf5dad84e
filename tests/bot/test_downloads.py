"""Model download: progress, resume after an interruption, checksum check, mirror URL — against a local server."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from bot.downloads import DownloadError, ModelFile, download_models, file_url


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    cut_after: dict[str, int] = {}  # path -> bytes to send before dropping the connection (once)
    requests: list[tuple[str, str | None]] = []

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append((self.path, self.headers.get("Range")))
        data = self.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.cut_after.pop(self.path, None)
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


@pytest.fixture
def server():
    _Handler.files, _Handler.cut_after, _Handler.requests = {}, {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/mirror", _Handler
    httpd.shutdown()


def _file(path: str, data: bytes) -> ModelFile:
    return ModelFile(path, hashlib.sha256(data).hexdigest(), len(data))


def test_url_encodes_equals_sign():
    url = file_url("https://h/x/", "a/s1-epoch=12.ckpt")
    assert url == "https://h/x/a/s1-epoch%3D12.ckpt"


def test_downloads_and_verifies(server, tmp_path: Path):
    base, handler = server
    blobs = {"gsv/model=1.ckpt": bytes(range(256)) * 5000, "hubert/config.json": b'{"a": 1}'}
    for p, d in blobs.items():
        handler.files["/mirror/" + file_url("", p).lstrip("/")] = d
    files = [_file(p, d) for p, d in blobs.items()]
    written = download_models(tmp_path, base, files, progress=False)
    assert sorted(written) == sorted(tmp_path / p for p in blobs)
    for p, d in blobs.items():
        assert (tmp_path / p).read_bytes() == d
    # second run: nothing to do, no requests
    n = len(handler.requests)
    assert download_models(tmp_path, base, files, progress=False) == []
    assert len(handler.requests) == n


def test_resumes_after_interruption(server, tmp_path: Path):
    base, handler = server
    data = bytes(range(256)) * 8000  # 2 MB
    handler.files["/mirror/m.pth"] = data
    handler.cut_after["/mirror/m.pth"] = 700_000
    f = _file("m.pth", data)
    with pytest.raises(DownloadError):
        download_models(tmp_path, base, [f], progress=False)
    part = tmp_path / "m.pth.part"
    partial = part.stat().st_size
    assert 0 < partial < len(data)
    assert not (tmp_path / "m.pth").exists()  # never a half file at the final path
    download_models(tmp_path, base, [f], progress=False)
    assert (tmp_path / "m.pth").read_bytes() == data
    assert handler.requests[-1][1] == f"bytes={partial}-"  # continued, not restarted
    assert not part.exists()


def test_checksum_mismatch_is_refused(server, tmp_path: Path):
    base, handler = server
    handler.files["/mirror/m.bin"] = b"tampered bytes"
    bad = ModelFile("m.bin", "0" * 64, None)
    with pytest.raises(DownloadError, match="SHA-256 mismatch"):
        download_models(tmp_path, base, [bad], progress=False)
    assert not (tmp_path / "m.bin").exists()
    assert not (tmp_path / "m.bin.part").exists()


def test_missing_file_names_mirror_setting(server, tmp_path: Path):
    base, _ = server
    with pytest.raises(DownloadError, match="download_base_url"):
        download_models(tmp_path, base, [ModelFile("nope.bin", None)], progress=False)


def test_unreachable_host(tmp_path: Path):
    with pytest.raises(DownloadError, match="cannot reach"):
        download_models(tmp_path, "http://127.0.0.1:9/x", [ModelFile("a.bin", None)], progress=False)
