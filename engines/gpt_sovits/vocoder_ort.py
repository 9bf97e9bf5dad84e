"""The vocoders of the diffusion families (v4/v5's 48 kHz HiFi-GAN, v3's 24 kHz BigVGAN) under ONNX Runtime on CPUs:
fp32 (the same samples to float rounding), and int8 residual blocks where a proof on the loaded model holds.

Why: the HiFi-GAN does about 65 GFLOP per second of 48 kHz audio (released size), nearly all of it in 1-D
convolutions, which torch's eager CPU path runs well below what ONNX Runtime's kernels reach on the same cores (the
ratio is in benchmarks/FINDINGS.md). The graph is traced from the loaded model at load (a few seconds), in memory.

int8 (with a cache folder): the residual blocks' convolutions as QDQ pairs, calibrated on the log-mels of synthetic
harmonic clips, then laid out channels-last (:func:`engines.vocoder_int8.channels_last_blocks`, as for the v2 vocoder).
The proof: on held-out synthetic mels (other pitches than the calibration's) the int8 audio must be within
:data:`MIN_SNR_DB` of fp32's. The graph and its measured SNR are kept in the folder, keyed by the vocoder file and
the runtimes' versions; a vocoder that misses the bound keeps the fp32 graph, logged.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from engines.gpt_sovits.mel import log_mel, resample
from engines.runtime import cpu_threads

if TYPE_CHECKING:
    import onnxruntime

log = logging.getLogger(__name__)

__all__ = ["MIN_SNR_DB", "OrtVocoder", "audio_snr_db", "export_graph"]

OPSET = 17
TRACE_FRAMES = 32  # mel frames of the tracing input (the frame axis is dynamic)
MIN_SNR_DB = 20.0  # int8 audio against fp32's on the held-out mels (the v2 int8 vocoder's bound)
QUANTISED_BLOCKS = "/resblocks"  # Conv nodes whose name contains this are quantised
CALIBRATION_PITCHES = (110.0, 160.0, 220.0, 300.0)  # Hz of the synthetic calibration clips
CHECK_PITCHES = (130.0, 250.0)  # Hz of the held-out clips the proof compares on
CLIP_S = 1.0  # seconds of each synthetic clip
KEPT_SCHEMA = 1


def _session(model: bytes | str, threads: int) -> onnxruntime.InferenceSession:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = cpu_threads(threads)
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # torch runs between calls on these cores
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def export_graph(vocoder: nn.Module) -> bytes:
    """``vocoder`` traced to an ONNX graph with a dynamic frame axis (TorchScript exporter)."""
    buf = io.BytesIO()
    mel = torch.zeros(1, 100, TRACE_FRAMES)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(vocoder, (mel,), buf, dynamo=False,  # pyright: ignore[reportUnknownMemberType, reportArgumentType]
                          input_names=["mel"], output_names=["wav"],
                          dynamic_axes={"mel": {2: "frames"}, "wav": {2: "samples"}}, opset_version=OPSET,
                          do_constant_folding=True)
    return buf.getvalue()


def _synthetic_mels(rate: int, n_fft: int, hop: int, pitches: tuple[float, ...]) -> list[np.ndarray]:
    """Log-mels ``[1, 100, frames]`` of 1 s harmonic clips at ``pitches`` (a vibrato of 5 %)."""
    out: list[np.ndarray] = []
    for f in pitches:
        t = torch.arange(int(CLIP_S * 32000), dtype=torch.float64) / 32000
        phase = 2 * math.pi * torch.cumsum(f * (1 + 0.05 * torch.sin(2 * math.pi * 4 * t)), 0) / 32000
        wav = (0.1 * sum((torch.sin(h * phase) / h for h in range(1, 12)), torch.zeros_like(t))).float()[None]
        out.append(log_mel(resample(wav, 32000, rate), rate, n_fft, hop).numpy().astype(np.float32))
    return out


def audio_snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """``10 log10(sum ref^2 / sum (out - ref)^2)`` over the waveform."""
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    return float(10 * np.log10(max(float(np.sum(ref64**2)), 1e-30) / max(float(np.sum((out64 - ref64) ** 2)), 1e-30)))


class OrtVocoder:
    """A vocoder module run by ONNX Runtime: ``log-mel [1, 100, T] -> wav [1, 1, hop T]`` as the module.

    Build with :meth:`from_module`; :attr:`precision` says what runs (``fp32`` or ``int8``).
    """

    def __init__(self, session: onnxruntime.InferenceSession, precision: str) -> None:
        self.session = session
        self.precision = precision

    def __call__(self, mel: Tensor) -> Tensor:
        (wav,) = self.session.run(["wav"], {"mel": mel.detach().float().cpu().contiguous().numpy()})
        return torch.as_tensor(np.asarray(wav, dtype=np.float32)).to(mel.device)

    @classmethod
    def from_module(cls, vocoder: nn.Module, threads: int = 0, int8: bool = False,
                    cache_dir: str | os.PathLike[str] | None = None, source: str | os.PathLike[str] | None = None,
                    mel_front_end: tuple[int, int, int] = (32000, 1280, 320),
                    min_snr_db: float = MIN_SNR_DB) -> OrtVocoder:
        """``vocoder`` (fp32, CPU) as an ONNX Runtime graph on ``threads`` threads (0: every core).

        With ``int8`` and a ``cache_dir``: the int8 graph where its proof holds on this vocoder (see the module
        notes), kept in ``cache_dir`` keyed by ``source`` (the vocoder file) and the runtimes' versions; else fp32.
        ``mel_front_end`` is ``(rate, n_fft, hop)`` of the family's mel, for the synthetic calibration mels.
        """
        graph = export_graph(vocoder) if cache_dir is None else _kept_graph(vocoder, Path(cache_dir), source)
        if int8 and cache_dir is not None:
            made = _int8_graph(graph, Path(cache_dir), source, mel_front_end, threads, min_snr_db)
            if made is not None:
                return cls(_session(str(made), threads), "int8")
        return cls(_session(graph, threads), "fp32")


def _kept_graph(vocoder: nn.Module, folder: Path, source: str | os.PathLike[str] | None) -> bytes:
    """:func:`export_graph`'s graph, kept in ``folder`` keyed by the vocoder file: tracing v3's BigVGAN takes tens of
    seconds, which a restart should not pay again."""
    path = folder / f"vocoder-fp32-{_key(source)}.onnx"
    try:
        return path.read_bytes()
    except OSError:
        pass
    graph = export_graph(vocoder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(graph)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep the vocoder's graph in %s (%s): it is traced again at the next start", folder, e)
    return graph


def _key(source: str | os.PathLike[str] | None) -> str:
    """The vocoder file (name, size, modification time) and the runtimes' versions, hashed."""
    import onnxruntime as ort

    digest = hashlib.sha256()
    if source is not None:
        st = Path(source).stat()
        digest.update(f"{Path(source).name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    digest.update(f"{torch.__version__}|{ort.__version__}|{CALIBRATION_PITCHES}|{CHECK_PITCHES}|{KEPT_SCHEMA}".encode())
    return digest.hexdigest()[:16]


def _int8_graph(graph: bytes, folder: Path, source: str | os.PathLike[str] | None, front: tuple[int, int, int],
                threads: int, min_snr_db: float) -> Path | None:
    """The proven int8 graph's path in ``folder`` (made and proven once, then reused), or None (fp32 runs)."""
    key = _key(source)
    path, record = folder / f"vocoder48k-int8-{key}.onnx", folder / f"vocoder48k-int8-{key}.json"
    snr: float | None = None
    try:
        data: dict[str, Any] = json.loads(record.read_text())
        if data.get("schema") == KEPT_SCHEMA and path.is_file():
            snr = float(data["snr_db"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if snr is None:
        try:
            snr = _make_int8(graph, folder, path, front, threads)
        except OSError as e:
            log.warning("could not write the int8 vocoder in %s (%s): the fp32 vocoder runs", folder, e)
            return None
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schema": KEPT_SCHEMA, "snr_db": snr, "min_snr_db": min_snr_db}))
        os.replace(tmp, record)
    if snr >= min_snr_db:
        log.info("48 kHz vocoder in int8: %.1f dB SNR against fp32 on this model (bound %.0f dB)", snr, min_snr_db)
        return path
    log.warning("the int8 48 kHz vocoder is %.1f dB from fp32 on this model (needs %.0f dB): the fp32 vocoder runs",
                snr, min_snr_db)
    return None


def _make_int8(graph: bytes, folder: Path, out: Path, front: tuple[int, int, int], threads: int) -> float:
    """Quantise ``graph``'s residual-block convolutions to ``out`` (written whole or not at all) and return the
    proof's SNR."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, \
        quantize_static

    from engines.vocoder_int8 import channels_last_blocks

    folder.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".fp32.tmp.onnx")
    tmp = out.with_suffix(".tmp.onnx")
    try:
        src.write_bytes(graph)
        model = onnx.load_from_string(graph)  # pyright: ignore[reportUnknownMemberType]
        convs = [n.name for n in model.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
        feeds = [{"mel": m} for m in _synthetic_mels(*front, CALIBRATION_PITCHES)]

        class _Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._it = iter(feeds)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._it, None)

        log.info("making the int8 48 kHz vocoder (%d convolutions, calibrated on %d synthetic mels)", len(convs),
                 len(feeds))
        quantize_static(str(src), str(tmp), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize=convs,
                        calibrate_method=CalibrationMethod.MinMax, extra_options={"ActivationSymmetric": False})
        quantised = onnx.load(str(tmp))  # pyright: ignore[reportUnknownMemberType]
        if channels_last_blocks(quantised):
            onnx.save(quantised, str(tmp))  # pyright: ignore[reportUnknownMemberType]
        fp32, int8 = _session(graph, threads), _session(str(tmp), threads)
        signal = error = 0.0
        for mel in _synthetic_mels(*front, CHECK_PITCHES):
            ref = np.asarray(fp32.run(None, {"mel": mel})[0], np.float64)
            got = np.asarray(int8.run(None, {"mel": mel})[0], np.float64)
            signal += float(np.sum(ref**2))
            error += float(np.sum((got - ref) ** 2))
        os.replace(tmp, out)
    finally:
        for leftover in (src, tmp, *folder.glob("*augmented_model*.onnx")):
            leftover.unlink(missing_ok=True)
    return float(10 * np.log10(max(signal, 1e-30) / max(error, 1e-30)))
