"""The DiT with its block linears in int8, for CPUs, used only where a proof on the loaded model holds.

Why: at the released size a sampler step spends most of its time in the 88 block linears (q/k/v, the attention
output and the two feed-forward products: 369 MFLOP a frame), which torch's dynamic int8 (int8 weights per output
channel, activations rounded to uint8 per call) runs two to three times faster than fp32 on AVX2 and AVX-512 CPUs
alike with fbgemm's kernels, and about twice as fast again with oneDNN's on AMX (the engine plan's ``int8_gemm``).
Where the plan says so (AMX: ``dit_attention`` bf16) attention runs in bf16, the other 40 % of a step at 1000 frames.
Everything else stays fp32: the input projection, the text embedding, the AdaLN modulations (computed once per call)
and the output layer.

The proof, per model: the fp32 DiT and the int8 copy sample the same synthetic sentence (the model's own features of
random semantic tokens and phones, styled by a synthetic harmonic reference whose log-mel is the prompt; the family's
guidance; :data:`PROOF_STEPS` steps at most; the same noise), and the int8 mel must be within :data:`MIN_SNR_DB` of
fp32's (signal: the fp32 mel's deviation from its mean; noise: the difference). Measured at the released size with
random weights: 43.5 dB (v5turbo). The verdict is kept in the cache folder given to :func:`choose_estimator`, keyed by
the SoVITS file (name, size, modification time), torch's version, the GEMM library, attention's dtype and this
recipe, so a restart does not prove again; a model that misses the bound keeps the fp32 DiT, with a log line saying
so.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from engines.gpt_sovits import cfm, int8_packing
from engines.gpt_sovits.dit import DiT
from engines.gpt_sovits.mel import log_mel, norm_spec, resample
from engines.gpt_sovits.mel_sovits import MelSoVITS
from engines.gpt_sovits.spectrogram import reference_spec_input

log = logging.getLogger(__name__)

__all__ = ["MIN_SNR_DB", "choose_estimator", "int8_dit", "mel_snr_db", "proof_key", "prove_int8_dit"]

MIN_SNR_DB = 30.0  # int8 mel against fp32's on the proof sentence (released size, random weights: 43.5 dB)
QUANTISED = (".attn.qkv", ".attn.to_out.0", ".ff.ff.0.0", ".ff.ff.2")  # the block linears made int8
PROOF_STEPS = 8  # the most sampler steps the proof runs (fewer where the family's default is fewer)
PROOF_TOKENS = (40, 40)  # semantic tokens of the synthetic reference and target (1.6 s each, ~160 frames)
PROOF_PHONES = 24
PROOF_SEED = 0
PROOF_RATE = 32000  # Hz of the synthetic reference
KEPT_SCHEMA = 1
ATTENTION_DTYPES = {"bf16": torch.bfloat16}  # the attention dtypes other than fp32 (engine plan's dit_attention)


def int8_dit(dit: DiT, gemm: str = "fbgemm", attention: str = "fp32") -> DiT:
    """A copy of ``dit`` whose block linears (:data:`QUANTISED`) are dynamic int8, packed for ``gemm`` (``fbgemm``
    or ``onednn``), with its attention in ``attention`` (``fp32`` or ``bf16``); every other tensor is shared."""
    memo: dict[int, Any] = {id(t): t for t in [*dit.parameters(), *dit.buffers()]}
    copied: DiT = copy.deepcopy(dit, memo)  # shares the fp32 tensors: nothing but the int8 weights is new
    modules: list[tuple[str, nn.Module]] = list(copied.named_modules())  # pyright: ignore[reportUnknownArgumentType]
    names = [name for name, m in modules
             if isinstance(m, nn.Linear) and name.startswith("transformer_blocks.") and name.endswith(QUANTISED)]
    from torch.ao.quantization.qconfig import per_channel_dynamic_qconfig

    spec: dict[str, Any] = {name: per_channel_dynamic_qconfig for name in names}
    copied.attend_in(ATTENTION_DTYPES.get(attention))
    with warnings.catch_warnings(), int8_packing(gemm):  # torch marks eager quantisation deprecated (torchao's now)
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(  # pyright: ignore[reportDeprecated, reportUnknownMemberType, reportUnknownVariableType]
            copied, spec, dtype=torch.qint8, inplace=True)


def mel_snr_db(ref: Tensor, out: Tensor) -> float:
    """``10 log10(sum (ref - mean ref)^2 / sum (out - ref)^2)``: the error against the mel's own spread."""
    ref64, out64 = ref.double(), out.double()
    signal = float((ref64 - ref64.mean()).pow(2).sum())
    error = float((out64 - ref64).pow(2).sum())
    return 10 * math.log10(max(signal, 1e-30) / max(error, 1e-30))


def _proof_inputs(sovits: MelSoVITS) -> tuple[Tensor, Tensor]:
    """``(mu [1, T, C], prompt mel [1, 100, R])`` of the synthetic proof sentence (see the module notes)."""
    spec = sovits.family
    device = sovits.codebook.device
    gen = torch.Generator().manual_seed(PROOF_SEED)
    t = torch.arange(3 * PROOF_RATE, dtype=torch.float64) / PROOF_RATE  # 3 s harmonic "voice", 140 Hz +- 20
    f0 = 140 + 20 * torch.sin(2 * math.pi * 3 * t)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / PROOF_RATE
    wav = (0.1 * sum((torch.sin(h * phase) / h for h in range(1, 10)), torch.zeros_like(t))).float()[None]
    ge = sovits.ref_style(reference_spec_input(wav).to(device))
    feats: list[Tensor] = []
    for tokens in PROOF_TOKENS:
        codes = torch.randint(0, sovits.cfg.codebook_size, (1, 1, tokens), generator=gen).to(device)
        phones = torch.randint(1, sovits.cfg.n_symbols, (1, PROOF_PHONES), generator=gen).to(device)
        feats.append(sovits.features(codes, phones, ge))
    mel = norm_spec(log_mel(resample(wav, PROOF_RATE, spec.mel_rate), spec.mel_rate, spec.mel_fft, spec.mel_hop))
    prompt = cfm.MelPrompt.from_reference(feats[0], mel.to(device), spec)
    return torch.cat((prompt.features, feats[1]), dim=-1).transpose(1, 2), prompt.mel


@torch.inference_mode()
def prove_int8_dit(sovits: MelSoVITS, int8: cfm.Estimator) -> float:
    """The mel SNR in dB of ``int8`` against ``sovits.dit`` (fp32) on the proof sentence (see the module notes)."""
    spec = sovits.family
    steps, cfg = cfm.check_sampling(spec, None, None)
    if steps > PROOF_STEPS and (not spec.allowed_steps or PROOF_STEPS in spec.allowed_steps):
        steps = PROOF_STEPS
    mu, prompt = _proof_inputs(sovits)
    noise = torch.randn((1, cfm.MEL_DIM, mu.shape[1]), generator=torch.Generator().manual_seed(PROOF_SEED + 1))
    noise = noise.to(mu.device)
    tp = prompt.shape[-1]
    ref = cfm.sample(sovits.dit, mu, prompt, steps, spec, cfg, noise)[..., tp:]
    out = cfm.sample(int8, mu, prompt, steps, spec, cfg, noise)[..., tp:]
    return mel_snr_db(ref, out)


def proof_key(model_files: Sequence[str | os.PathLike[str]], gemm: str = "fbgemm", attention: str = "fp32") -> str:
    """What a kept verdict holds for: the files the model was read from (each one's name, size, modification time:
    a LoRA file and its base), torch's version and the GEMM library (their int8 kernels), attention's dtype, the
    bound, the recipe and the proof's inputs."""
    digest = hashlib.sha256()
    for model_file in model_files:
        st = Path(model_file).stat()
        digest.update(f"{Path(model_file).name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    digest.update(f"{torch.__version__}|{MIN_SNR_DB}|{QUANTISED}|{PROOF_STEPS}|{PROOF_TOKENS}|{PROOF_PHONES}|"
                  f"{PROOF_SEED}|{KEPT_SCHEMA}".encode())
    if (gemm, attention) != ("fbgemm", "fp32"):  # (the first recipe's verdicts keep their keys)
        digest.update(f"|{gemm}|{attention}".encode())
    return digest.hexdigest()[:16]


def _kept(record: Path, key: str) -> float | None:
    """The SNR kept for ``key`` in ``record``, or None (absent, unreadable or about another model)."""
    try:
        data = json.loads(record.read_text())
        if data.get("schema") == KEPT_SCHEMA and data.get("key") == key:
            return float(data["snr_db"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _keep(record: Path, key: str, snr: float, bound: float) -> None:
    """Write the verdict whole or not at all (temp file + rename); a folder that cannot be written is logged."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schema": KEPT_SCHEMA, "key": key, "snr_db": snr, "min_snr_db": bound}))
        os.replace(tmp, record)
    except OSError as e:
        log.warning("could not keep the int8 DiT's proof in %s (%s): it runs again at the next start", record.parent, e)


def choose_estimator(sovits: MelSoVITS, model_files: Sequence[str | os.PathLike[str]],
                     cache_dir: str | os.PathLike[str] | None, min_snr_db: float = MIN_SNR_DB, *,
                     gemm: str = "fbgemm", attention: str = "fp32") -> tuple[cfm.Estimator, str]:
    """The fast path's DiT for ``sovits``: ``(int8 copy, "int8")`` where its proof holds on this model, else
    ``(sovits.dit, "fp32")``, logged. On a GPU always fp32 (torch's dynamic int8 is a CPU kernel).

    Parameters
    ----------
    model_files:
        the files the model was read from: its SoVITS file, and a LoRA file's base (their identity keys the kept
        verdict).
    cache_dir:
        where the verdict is kept (``dit-int8-<key>.json``); None: proven at every load, nothing kept.
    min_snr_db:
        the bound (:data:`MIN_SNR_DB`).
    gemm, attention:
        the engine plan's ``int8_gemm`` and ``dit_attention`` (:func:`int8_dit`).
    """
    if sovits.codebook.device.type != "cpu" or sovits.codebook.dtype != torch.float32:
        return sovits.dit, "fp32"
    key = proof_key(model_files, gemm, attention)
    record = Path(cache_dir) / f"dit-int8-{key}.json" if cache_dir is not None else None
    snr = _kept(record, key) if record is not None else None
    int8 = int8_dit(sovits.dit, gemm, attention)
    if snr is None:
        snr = prove_int8_dit(sovits, int8)
        if record is not None:
            _keep(record, key, snr, min_snr_db)
    else:
        log.debug("int8 DiT: the kept proof of this model (%.1f dB) is reused", snr)
    name = sovits.family.name
    if snr >= min_snr_db:
        log.info("%s DiT in int8 (%s products, %s attention): its mel is %.1f dB from fp32's on this model (bound "
                 "%.0f dB)", name, gemm, attention, snr, min_snr_db)
        return int8, "int8"
    log.warning("%s DiT in int8 is %.1f dB from fp32 on this model (needs %.0f dB): the fp32 DiT runs", name, snr,
                min_snr_db)
    return sovits.dit, "fp32"
