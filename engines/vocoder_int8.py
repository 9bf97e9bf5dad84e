"""An int8 SoVITS vocoder for CPUs (the onnx engine; ``engine.vocoder_precision: auto`` with the int8 GPT), made once
per model and proven on it.

Why: the HiFi-GAN of a v2 SoVITS does about 42 GFLOP per second of audio, so by its FLOPs the fp32 vocoder cannot go
below an RTF of about 0.26 on a 2-core AVX2 CPU, while int8 products run about twice as many operations per cycle on
AVX2 (ONNX Runtime's u8 x s8 kernels; see FINDINGS.md#vocoder-why-int8).

What is quantised: only the Conv nodes of the decoder's residual blocks (90 % of the work), as QDQ pairs that ONNX
Runtime fuses into int8 convolutions: weights symmetric int8 per output channel, activations uint8 per tensor with
ranges calibrated (min/max) on synthetic decodes of the model itself (random semantic tokens and phones, a style
vector from a synthetic harmonic reference, the prior noise at its default scale). The input and output layers,
upsamplers, text encoder and flow stay fp32: quantising every decoder convolution measured 26 dB SNR against fp32,
the resblocks alone 32 dB (real-size random weights). The quantised blocks are then laid out channels-last
(:func:`channels_last_blocks`: the same samples, 6-8 % faster).

The proof, per model (``engine.vocoder_precision: auto`` picks int8 only with it): once made, the int8 graph and the
fp32 one decode the same held-out synthetic inputs (other seeds than the calibration's, the same prior noise) and the
int8 audio must be within :data:`MIN_SNR_DB` of fp32's (signal-to-noise ratio of the difference). The figure is kept
next to the graph (``sovits_decode.int8.v2.json``); a model that misses it keeps the fp32 vocoder under ``auto``, with a
log line saying so. Measured: 24.5-24.8 dB on the golden checkpoints, 32 dB at the real size (random weights).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from engines.base import EngineError

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

log = logging.getLogger(__name__)

__all__ = ["INT8_VOCODER", "MIN_SNR_DB", "QUANTISED_BLOCKS", "channels_last_blocks", "choose_vocoder", "quantize_qdq",
           "quantize_vocoder_int8", "vocoder_int8_snr_db"]

INT8_VOCODER = "sovits_decode.int8.v2"  # graph file written next to sovits_decode.onnx (v2: channels-last blocks)
FORMER_GRAPHS = ("sovits_decode.int8",)  # earlier formats of it, removed when it is made
QUANTISED_BLOCKS = "/resblocks"  # Conv nodes whose name contains this are quantised (the decoder's residual blocks)
CALIBRATION_DECODES = 4  # synthetic decodes the activation ranges are measured on
CALIBRATION_TOKENS = 40  # semantic tokens per calibration decode (1.6 s of audio)
NOISE_SCALE = 0.5  # the prior noise scale of the calibration decodes (the API's default)
SEED = 0
CHECK_DECODES = 2  # held-out synthetic decodes the proof compares int8 with fp32 on
CHECK_SEED = 1
MIN_SNR_DB = 20.0  # int8 audio against fp32's on the check decodes (golden 24.5-24.8 dB, real size 32 dB)
PROOF_FILE = f"{INT8_VOCODER}.json"  # the measured SNR, next to the graph
PROOF_SCHEMA = 1


def quantize_vocoder_int8(folder: str | os.PathLike[str]) -> Path:
    """``sovits_decode.int8.v2.onnx`` in ``folder`` (an export folder of :func:`engines.export.ensure_onnx`), written
    once; returns its path. Takes a few seconds per model at the real size."""
    folder = Path(folder)
    out = folder / f"{INT8_VOCODER}.onnx"
    for former in FORMER_GRAPHS:  # an earlier format's graph and proof, not read again
        for suffix in (".onnx", ".json"):
            (folder / f"{former}{suffix}").unlink(missing_ok=True)
    if out.is_file():
        return out
    import onnx

    tmp = out.with_suffix(".tmp.onnx")
    try:
        quantize_qdq(folder, tmp)
        model = onnx.load(str(tmp))  # pyright: ignore[reportUnknownMemberType]  # (f: a bare PathLike)
        if channels_last_blocks(model):
            onnx.save(model, str(tmp))  # pyright: ignore[reportUnknownMemberType]
        else:
            log.warning("the int8 vocoder's residual blocks are not in the expected form: they keep ONNX Runtime's "
                        "own layout (a few %% slower)")
        os.replace(tmp, out)  # complete or absent: a crash mid-write leaves no half file under the final name
    finally:
        tmp.unlink(missing_ok=True)
    return out


def quantize_qdq(folder: Path, out: Path) -> None:
    """The residual blocks' convolutions of ``folder``'s ``sovits_decode.onnx`` as QDQ pairs (see the module notes),
    written to ``out``: ONNX Runtime's static quantisation, calibrated on synthetic decodes."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, \
        quantize_static

    src = folder / "sovits_decode.onnx"
    model = onnx.load(str(src), load_external_data=False)  # pyright: ignore[reportUnknownMemberType]  # (f: a bare PathLike)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
    if not convs:
        raise EngineError(f"{src} has no decoder residual-block convolutions to quantise; export it again")
    feeds = _synthetic_feeds(folder, {i.name for i in model.graph.input}, CALIBRATION_DECODES, SEED)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    log.info("making the int8 vocoder (%d convolutions, calibrated on %d synthetic decodes)", len(convs), len(feeds))
    try:
        quantize_static(str(src), str(out), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize=convs,
                        calibrate_method=CalibrationMethod.MinMax, extra_options={"ActivationSymmetric": False})
    finally:
        for leftover in folder.glob("*augmented_model*.onnx"):  # the calibrator's scratch graph
            leftover.unlink(missing_ok=True)


def channels_last_blocks(model: ModelProto) -> int:
    """Rewrite ``model`` (the quantised ``sovits_decode`` graph, QDQ form) in place so that each upsampling stage's
    residual blocks run channels-last: ``[N, T, C]`` from the upsampler's output to the blocks' mean, every
    quantised convolution as ONNX Runtime's ``com.microsoft.QLinearConv`` with ``channels_last=1``, one Transpose
    in and one out per stage. Returns the convolutions rewritten; 0 (and ``model`` untouched) when a stage is not
    what this expects: an upsampler's output feeding only quantised convolutions and element-wise operations with
    scalar operands, up to the activation before the next layer.

    Why: ONNX Runtime runs the int8 convolutions channels-last anyway and wraps each chain of them in Transposes,
    with a Dequantize/Quantize pair beside most (143 Transposes for 90 convolutions, 10 % of the vocoder's time).
    Rewritten, the output is bit-identical and the vocoder 6-8 % faster (see FINDINGS.md#vocoder-why-int8).
    """
    from onnx import helper

    graph = model.graph
    producer: dict[str, NodeProto] = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list[NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    scalars = {i.name for i in graph.initializer if int(np.prod(i.dims)) <= 1}
    scalars |= {n.output[0] for n in graph.node if n.op_type == "Constant"
                and all(int(np.prod(a.t.dims)) <= 1 for a in n.attribute if a.name == "value")}
    stages: list[tuple[str, dict[str, NodeProto], str]] = []  # (upsampler output, its stage's nodes, their result)
    # (Conv, DequantizeLinear of its input, of its weight, of its bias, QuantizeLinear of its output)
    convs: list[tuple[NodeProto, NodeProto, NodeProto, NodeProto, NodeProto]] = []
    for up in (n for n in graph.node if n.op_type == "ConvTranspose" and "/ups." in n.name):
        region: dict[str, NodeProto] = {}
        exits: list[NodeProto] = []
        frontier = list(consumers.get(up.output[0], []))
        while frontier:
            n = frontier.pop()
            if n.name in region:
                continue
            if QUANTISED_BLOCKS not in n.name and n.op_type == "LeakyRelu":  # the activation before the next layer
                exits.append(n)
                continue
            region[n.name] = n
            for out in n.output:
                frontier.extend(consumers.get(out, []))
        made = {out for n in region.values() for out in n.output} | {up.output[0]}
        ends = {name for x in exits for name in x.input if name in made}
        if len(ends) != 1 or up.output[0] in ends:
            return 0
        for n in region.values():
            if n.op_type == "Conv":
                x, w, b = (producer.get(name) for name in (*n.input, "", "")[:3])
                after = consumers.get(n.output[0], [])
                one_d = [len(a.ints) for a in n.attribute if a.name == "kernel_shape"] == [1]  # [N, C, T] tensors
                if not (one_d and x and w and b and x.op_type == w.op_type == b.op_type == "DequantizeLinear"
                        and len(w.input) == 3 and len(after) == 1 and after[0].op_type == "QuantizeLinear"):
                    return 0
                convs.append((n, x, w, b, after[0]))
            elif n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                if any(name not in scalars for name in n.input[1:]):  # per-tensor: any layout
                    return 0
            elif n.op_type not in ("LeakyRelu", "Add", "Mul", "Div") or any(
                    name not in made and name not in scalars for name in n.input):
                return 0  # an operation or an operand that the layout would change
        stages.append((up.output[0], region, ends.pop()))
    if not convs:
        return 0
    replaced: dict[str, NodeProto] = {}
    for conv, x, w, b, q in convs:
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        replaced[conv.name] = helper.make_node(
            "QLinearConv", [*x.input, *w.input, *q.input[1:], b.input[0]], [q.output[0]], domain="com.microsoft",
            name=f"{conv.name}/channels_last", channels_last=1, **attrs)
    gone = set(replaced) | {q.name for *_, q in convs}
    for _, *dqs, _ in convs:  # the Dequantize nodes only the rewritten convolutions read
        gone |= {dq.name for dq in dqs if all(c.name in replaced for c in consumers[dq.output[0]])}
    inserted: dict[str, NodeProto] = {}  # a Transpose after the node that makes this tensor
    for source, region, end in stages:
        into = f"{source}/channels_last"
        inserted[source] = helper.make_node("Transpose", [source], [into], perm=[0, 2, 1], name=into)
        for n in region.values():
            n.input[:] = [into if name == source else name for name in n.input]
        inner = f"{end}/channels_last"
        producer[end].output[:] = [inner if name == end else name for name in producer[end].output]
        inserted[inner] = helper.make_node("Transpose", [inner], [end], perm=[0, 2, 1], name=f"{end}/channels_first")
    nodes: list[NodeProto] = []
    for n in graph.node:
        if n.name not in gone or n.name in replaced:
            nodes.append(replaced.get(n.name, n))
            nodes.extend(inserted[out] for out in nodes[-1].output if out in inserted)
    del graph.node[:]
    graph.node.extend(nodes)
    used = _inputs(nodes)
    kept = [i for i in graph.initializer if i.name in used]  # (the dropped nodes' scales: ONNX Runtime warns of each)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]  # shapes inferred for the former layout
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(convs)


def _inputs(nodes: Iterable[NodeProto]) -> set[str]:
    """Every tensor ``nodes`` read, also inside their subgraphs (which may read the outer graph's initializers)."""
    names: set[str] = set()
    for n in nodes:
        names.update(n.input)
        for a in n.attribute:
            for sub in (a.g, *a.graphs) if a.HasField("g") or a.graphs else ():
                names |= _inputs(sub.node)
    return names


def vocoder_int8_snr_db(folder: str | os.PathLike[str]) -> float:
    """The int8 vocoder's SNR against fp32 in dB on the held-out check decodes (see the module notes): measured once
    after :func:`quantize_vocoder_int8` (a few seconds at the real size) and kept in ``sovits_decode.int8.v2.json``."""
    folder = Path(folder)
    graph, proof = folder / f"{INT8_VOCODER}.onnx", folder / PROOF_FILE
    try:
        record = json.loads(proof.read_text())
        if record.get("schema") == PROOF_SCHEMA and record.get("graph_mtime_ns") == graph.stat().st_mtime_ns:
            return float(record["snr_db"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or about another graph: measure again
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sessions = [ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
                for path in (folder / "sovits_decode.onnx", graph)]
    names = {i.name for i in sessions[0].get_inputs()}
    signal = error = 0.0
    for feed in _synthetic_feeds(folder, names, CHECK_DECODES, CHECK_SEED):
        ref, out = (np.asarray(s.run(None, feed)[0], np.float64) for s in sessions)
        signal += float(np.sum(ref ** 2))
        error += float(np.sum((out - ref) ** 2))
    snr = float(10 * np.log10(signal / max(error, 1e-30)))
    tmp = proof.with_suffix(".tmp")
    tmp.write_text(json.dumps({"schema": PROOF_SCHEMA, "snr_db": snr, "min_snr_db": MIN_SNR_DB,
                               "decodes": CHECK_DECODES, "graph_mtime_ns": graph.stat().st_mtime_ns}))
    os.replace(tmp, proof)
    return snr


def choose_vocoder(folder: str | os.PathLike[str], vocoder: str) -> tuple[Path, str]:
    """The ``sovits_decode`` graph to run for ``engine.vocoder_precision`` (``auto``, ``fp32`` or ``int8``) and the
    precision it has: ``auto`` is int8 when its proof holds on this model, else fp32 (logged); ``int8`` is int8
    whatever the proof says (a miss is logged)."""
    folder = Path(folder)
    if vocoder == "fp32":
        return folder / "sovits_decode.onnx", "fp32"
    path = quantize_vocoder_int8(folder)
    snr = vocoder_int8_snr_db(folder)
    if snr >= MIN_SNR_DB:
        log.info("int8 vocoder: %.1f dB SNR against fp32 on this model (bound %.0f dB)", snr, MIN_SNR_DB)
        return path, "int8"
    if vocoder == "auto":
        log.warning("the int8 vocoder is %.1f dB from fp32 on this model (needs %.0f dB): the fp32 vocoder runs "
                    "(engine.vocoder_precision: auto)", snr, MIN_SNR_DB)
        return folder / "sovits_decode.onnx", "fp32"
    log.warning("the int8 vocoder is %.1f dB from fp32 on this model (auto would need %.0f dB); running it as "
                "engine.vocoder_precision: int8 asks", snr, MIN_SNR_DB)
    return path, "int8"


def _synthetic_feeds(folder: Path, names: set[str], count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Inputs of ``sovits_decode`` (whose inputs are ``names``) for ``count`` synthetic decodes (see the module
    notes): the calibration's, or with another seed the proof's."""
    import onnxruntime as ort

    from engines.export import load_manifest
    from engines.gpt_sovits.spectrogram import reference_spec_input

    manifest = load_manifest(folder)
    vocab, symbols = int(manifest["gpt"]["vocab"]) - 1, int(manifest["sovits"]["n_symbols"])
    channels = int(manifest["sovits"]["inter_channels"])
    rng = np.random.default_rng(seed)
    feed_names = {"codes", "text", "ge", "noise"}
    if feed_names != names:
        raise EngineError(f"sovits_decode takes {sorted(names)}, the int8 vocoder feeds {sorted(feed_names)}")
    style = ort.InferenceSession(str(folder / "ref_style.onnx"), providers=["CPUExecutionProvider"])
    feeds: list[dict[str, np.ndarray]] = []
    for i in range(count):
        t = np.arange(32000 * 3) / 32000  # 3 s of a harmonic "voice" at 100-250 Hz with a slow vibrato
        f0 = 100 + 50 * i + 20 * seed + 5 * np.sin(2 * np.pi * 5 * t)
        wav = sum((np.sin(2 * np.pi * np.cumsum(f0 * h) / 32000) / h for h in range(1, 12)),
                  np.zeros_like(t)).astype(np.float32) * 0.1  # (a start of zeros, not 0: the sum is an array)
        spec = reference_spec_input(wav).numpy()
        style_in: dict[str, np.ndarray] = {}
        for inp in style.get_inputs():  # v2Pro's graph also takes speaker features: zeros of their shape
            style_in[inp.name] = spec if inp.name == "spec" else np.zeros(
                [d if isinstance(d, int) else 1 for d in inp.shape], np.float32)
        ge = style.run(None, style_in)[0]
        text = rng.integers(1, symbols, (1, 30 + 10 * i)).astype(np.int64)
        codes = rng.integers(0, vocab, (1, 1, CALIBRATION_TOKENS)).astype(np.int64)
        noise = (rng.standard_normal((1, channels, 2 * CALIBRATION_TOKENS)) * NOISE_SCALE).astype(np.float32)
        feeds.append({"codes": codes, "text": text, "ge": ge, "noise": noise})
    return feeds
