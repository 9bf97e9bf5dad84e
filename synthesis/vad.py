"""Voice activity: how likely each moment of a clip is human speech, from Silero VAD's ONNX model.

An energy gate cannot tell a voice from a noise burst, music or a door slam of the same loudness; Silero VAD (MIT,
shipped as ONNX inside the ``silero-vad`` wheel) can. Its "sequence" export runs a whole block of 32 ms frames in one
ONNX Runtime call, so a 60 s upload costs a few tens of milliseconds on one core. The package itself is not imported:
its ``__init__`` pulls in torch and calls ``torch.set_num_threads(1)``, which would slow the engines in this process.
Only its model file is used, run here with ONNX Runtime on numpy arrays.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

VAD_RATE = 16_000  # Hz, the model's input rate
VAD_FRAME = 512  # samples per frame at VAD_RATE (32 ms), one probability each
VAD_CONTEXT = 64  # samples of the previous frame the model sees before each frame
VAD_FRAME_S = VAD_FRAME / VAD_RATE  # 0.032 s
_BLOCK_FRAMES = 512  # frames per ONNX call (16.4 s): bounds the transient input array to 1.2 MB
_MODEL_FILE = "silero_vad_16k_sequence.onnx"
_STATE_SHAPE = (1, 1, 128)  # LSTM h and c

_lock = threading.Lock()
_session: Any = None
_unavailable: str | None = None


def model_path() -> Path | None:
    """Where the installed ``silero-vad`` wheel keeps its sequence ONNX model (None when it is not installed)."""
    spec = importlib.util.find_spec("silero_vad")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / _MODEL_FILE
    return path if path.is_file() else None


def _get_session() -> Any:
    """The shared ONNX Runtime session (created once; ``run`` is thread-safe), or None when unavailable."""
    global _session, _unavailable
    with _lock:
        if _session is not None or _unavailable is not None:
            return _session
        path = model_path()
        if path is None:
            _unavailable = f"{_MODEL_FILE} not found: install the silero-vad package (pip install -e .)"
        else:
            try:
                import onnxruntime as ort

                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1  # a small LSTM: one core is enough, and leaves the rest to synthesis
                opts.inter_op_num_threads = 1
                _session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
            except Exception as e:  # a broken install must not stop voice creation; the energy gate remains
                _unavailable = f"cannot load {path}: {e}"
        if _unavailable is not None:
            log.warning("voice activity detection is off, references are chosen by loudness only: %s", _unavailable)
        return _session


def speech_probability(x: np.ndarray) -> np.ndarray | None:
    """Probability of speech in each 32 ms frame of a clip.

    Parameters
    ----------
    x: ``[N]`` float32 mono @ :data:`VAD_RATE`.

    Returns
    -------
    ``[ceil(N / VAD_FRAME)]`` float32 in [0, 1]; frame ``i`` covers samples ``[i * 512, (i + 1) * 512)`` (the last
    one zero-padded). None when the model is not available (the caller falls back to loudness).
    """
    session = _get_session()
    if session is None:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_frames = -(-x.size // VAD_FRAME)
    frames = np.zeros((n_frames, VAD_FRAME), np.float32)  # [F, 512]
    frames.reshape(-1)[: x.size] = x
    context = np.zeros((n_frames, VAD_CONTEXT), np.float32)  # [F, 64] the tail of the frame before
    context[1:] = frames[:-1, -VAD_CONTEXT:]
    inputs = np.concatenate([context, frames], axis=1)  # [F, 576]
    h = np.zeros(_STATE_SHAPE, np.float32)
    c = np.zeros(_STATE_SHAPE, np.float32)
    out: list[np.ndarray] = []
    for i in range(0, n_frames, _BLOCK_FRAMES):
        probs, h, c = session.run(None, {"input": inputs[i : i + _BLOCK_FRAMES], "h": h, "c": c})
        out.append(np.asarray(probs, np.float32).reshape(-1))
    return np.concatenate(out) if out else np.zeros(0, np.float32)
