"""Write a second golden set, in the shared set's formats, with other sizes, seeds, prompt split and lengths.

This checks the TESTS' independence from one data set, not conformance. Its outputs are computed by this project's
own implementation (the one the shared set proves equal to upstream's), so a run on it cannot show that the
implementation matches upstream; it shows that no conformance test hard-codes a fact of the shared set (a prompt
split, a stop step, a length, a width, a parameter count): every such fact must come from the data.

What differs from the shared set (tests/data/golden): GPT 64 wide, 2 heads, 2 layers; SoVITS hidden/inter 48,
filter 192, 3 encoder layers, gin (and MRTE) 96, upsample_initial_channel 128; other seeds; 29 phones of which 6
are the prompt's, 33 prompt tokens, early_stop_num 50 (reference-free: 12), 31 SoVITS codes over 23 phones, other
reference and spectrogram lengths, 3-row sampler cases. The file formats are the shared set's: the GPT ``.ckpt``
(``{"weight": "model."-prefixed fp16, "config", "info"}``) and the SoVITS ``.pth`` with a pickled ``utils.HParams``
config, written with :mod:`engines.gpt_sovits.tiny`'s upstream-format weight writers; the arrays carry the shared
set's names; ``meta.json`` the same keys, plus the two call parameters no array holds (``gpt.reffree``,
``gpt.batch``), which the shared set states only in its README.

The model seed is the first from ``--seed`` whose random GPT behaves as the tests need of any golden set: both
greedy runs stop by EOS inside the window, the reference-free run reaches its limit, and the recorded top-2 margins
are clear of fp32 noise (>= 1e-3).

Usage::

    .venv/bin/python tests/tools/make_golden_variant.py /tmp/golden-variant
    VOICEBOT_GOLDEN_DIR=/tmp/golden-variant .venv/bin/python -m pytest -m conformance tests/engines -q
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engines.base import EOS_TOKEN, SamplingParams, SemanticRequest, VoicePrompt  # noqa: E402
from engines.gpt_sovits import tiny  # noqa: E402
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint, load_sovits_checkpoint  # noqa: E402
from engines.gpt_sovits.generate import generate  # noqa: E402
from engines.gpt_sovits.gpt import Text2SemanticModel  # noqa: E402
from engines.gpt_sovits.naive import naive_generate  # noqa: E402
from engines.gpt_sovits.sampling import logits_to_probs  # noqa: E402
from engines.gpt_sovits.sovits import SoVITSDecoder, mean_style  # noqa: E402
from engines.gpt_sovits.spectrogram import linear_spectrogram  # noqa: E402
from tests.golden import greedy_choices, teacher_forced_logits  # noqa: E402

log = logging.getLogger("make_golden_variant")

SIZE = "variant"  # the key this script registers in tiny's size tables (in this process only)
GPT_DIMS = (64, 2, 2)  # width, heads, layers
SOVITS_DIMS = (48, 192, 2, 3, 96, 128)  # inter=hidden, filter, heads, layers, gin, upsample_initial_channel
EOS_OFFSET = 2.6  # tiny's constant EOS logit, for this size (the seed search does the rest)
N_PHONES, N_PROMPT_PHONES, N_PROMPT_TOKENS, N_BATCH1_TARGET = 29, 6, 33, 14
EARLY_STOP, REFFREE_STOP = 50, 12  # prompted runs / reference-free run
GREEDY = {"rp135": 1.35, "rp100": 1.0}
REFFREE_RP = BATCH_RP = 1.35
N_CODES, N_TEXT, REF_SAMPLES, REF2_SAMPLES, SSL_FRAMES, SPEC_SAMPLES = 31, 23, 57000, 41000, 53, 50011
SPEED, NOISE = 1.25, 0.5  # the array names say them: wav_ns0_speed125, wav_ns05_eps
MIN_MARGIN = 1e-3  # recorded top-2 margins must be clear of fp32 noise (logits agree to ~3e-6)
MIN_STOP_MARGIN = 0.25  # and the EOS decision at the stop clear of half-precision noise
SAMPLING_CASES = [  # (params, vocab): two cases with the EOS column cut, as the shared set
    ({"top_k": 10, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.35}, 1025),
    ({"top_k": 30, "top_p": 0.7, "temperature": 0.7, "repetition_penalty": 1.2}, 1024),
    ({"top_k": 3, "top_p": 0.9, "temperature": 1.5, "repetition_penalty": 1.0}, 1025),
    ({"top_k": 1, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.5}, 1024),
    ({"top_k": 1025, "top_p": 0.4, "temperature": 0.9, "repetition_penalty": 1.8}, 1025),
]


def _register_sizes() -> None:
    """Add this set's sizes to tiny's tables, so its upstream-format writers build these models."""
    tiny.GPT_SIZES[SIZE] = GPT_DIMS
    tiny.SOVITS_SIZES[SIZE] = SOVITS_DIMS
    tiny.EOS_LOGIT_OFFSET[SIZE] = EOS_OFFSET


class _HParams:
    """Pickles as upstream's ``utils.HParams`` (attributes; nested dicts become HParams), as fine-tuned files do."""

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, _HParams(**v) if isinstance(v, dict) else v)


def _save_with_hparams(obj: dict[str, Any], path: Path) -> None:
    """torch.save ``obj`` with its ``config`` pickled as ``utils.HParams``."""
    module = types.ModuleType("utils")
    _HParams.__module__, _HParams.__qualname__ = "utils", "HParams"
    module.HParams = _HParams  # type: ignore[attr-defined]
    sys.modules["utils"] = module
    try:
        torch.save({**obj, "config": _HParams(**obj["config"])}, path)  # torch's default protocol, as upstream
    finally:
        del sys.modules["utils"]


def _greedy_ok(model: Text2SemanticModel, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray,
               ref_phones: np.ndarray, ref_bert: np.ndarray, batch1: tuple[np.ndarray, np.ndarray]) -> bool:
    """Does this GPT make a usable golden set (see the module notes)?"""
    for rp in GREEDY.values():
        gen = naive_generate(model, phones, bert, prompt, SamplingParams(top_k=1, repetition_penalty=rp,
                                                                        early_stop_num=EARLY_STOP))
        if not 13 <= len(gen) < EARLY_STOP - 1:  # shorter than the limit's EARLY_STOP tokens: stopped by EOS
            return False
        raw = teacher_forced_logits(model, phones, bert, prompt, gen)
        choices = greedy_choices(raw, prompt, gen, rp)
        margins = [m for _, m in choices]
        if choices[-1][0] != EOS_TOKEN or min(margins) < MIN_MARGIN or margins[-1] < MIN_STOP_MARGIN:
            return False
    other = naive_generate(model, *batch1, prompt, SamplingParams(top_k=1, repetition_penalty=BATCH_RP,
                                                                  early_stop_num=EARLY_STOP))
    if len(other) >= EARLY_STOP - 1:
        return False
    free = naive_generate(model, ref_phones, ref_bert, np.zeros(0, np.int64),
                          SamplingParams(top_k=1, repetition_penalty=REFFREE_RP, early_stop_num=REFFREE_STOP))
    if len(free) != REFFREE_STOP + 1:
        return False
    raw = teacher_forced_logits(model, ref_phones, ref_bert, np.zeros(0, np.int64), free[:-1])
    return min(m for _, m in greedy_choices(raw, np.zeros(0, np.int64), free[:-1], REFFREE_RP)) >= MIN_MARGIN


def write_variant(out: Path, seed: int) -> dict[str, Any]:
    """Write the variant set to ``out``; returns its meta.json content."""
    _register_sizes()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    phones = rng.integers(1, tiny.N_PHONES, N_PHONES).astype(np.int64)
    bert = (0.25 * rng.standard_normal((1024, N_PHONES))).astype(np.float32)
    prompt = rng.integers(0, 1024, N_PROMPT_TOKENS).astype(np.int64)
    n = N_PROMPT_PHONES
    batch1_phones = np.concatenate([phones[:n], rng.integers(1, tiny.N_PHONES, N_BATCH1_TARGET)]).astype(np.int64)
    batch1_bert = np.concatenate([bert[:, :n], (0.25 * rng.standard_normal((1024, N_BATCH1_TARGET)))],
                                 axis=1).astype(np.float32)

    # ---- GPT: the first model seed that behaves (module notes)
    gpt_path = out / "gpt_variant_v2.ckpt"
    for model_seed in range(seed, seed + 200):
        ckpt = OrderedDict(weight=tiny.gpt_state_dict(SIZE, model_seed), config=tiny.gpt_config(SIZE),
                           info="GPT-e3")
        torch.save(ckpt, gpt_path)
        gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(gpt_path))
        if _greedy_ok(gpt, phones, bert, prompt, phones[n:], bert[:, n:], (batch1_phones, batch1_bert)):
            break
    else:
        raise SystemExit(f"no GPT seed in {seed}..{seed + 199} behaves; change EOS_OFFSET or --seed")
    log.info("GPT model seed %d", model_seed)

    io: dict[str, np.ndarray] = {
        "phone_ids": phones[None], "bert_feature": bert[None], "prompt_semantic": prompt[None],
        "phone_lens": np.array([N_PHONES]), "n_prompt_phones": np.array(n), "early_stop_num": np.array(EARLY_STOP),
    }
    greedy_meta: dict[str, Any] = {}
    for key, rp in GREEDY.items():
        params = SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=EARLY_STOP)
        gen = naive_generate(gpt, phones, bert, prompt, params)
        raw = teacher_forced_logits(gpt, phones, bert, prompt, gen)
        margins = np.array([m for _, m in greedy_choices(raw, prompt, gen, rp)], np.float32)
        io.update({f"greedy_{key}_y": np.concatenate([prompt, gen])[None], f"greedy_{key}_idx": np.array(len(gen)),
                   f"greedy_{key}_generated": gen, f"greedy_{key}_logits_raw": raw,
                   f"greedy_{key}_top2_margin": margins})
        greedy_meta[key] = {"idx": len(gen), "generated_len": len(gen), "stopped_by_eos": True,
                            "min_top2_margin": float(margins.min())}
    with torch.inference_mode():
        io["x_emb"] = gpt.embed_text(torch.as_tensor(phones[None]), torch.as_tensor(bert[None])).numpy()
        io["prompt_y_pos"] = gpt.embed_prompt(torch.as_tensor(prompt[None])).numpy()
    free_params = SamplingParams(top_k=1, repetition_penalty=REFFREE_RP, early_stop_num=REFFREE_STOP)
    free = naive_generate(gpt, phones[n:], bert[:, n:], np.zeros(0, np.int64), free_params)
    io.update({"reffree_phone_ids": phones[None, n:], "reffree_bert_feature": bert[None, :, n:],
               "reffree_y": free[None].astype(np.int32),
               "reffree_logits_raw": teacher_forced_logits(gpt, phones[n:], bert[:, n:], np.zeros(0, np.int64),
                                                           free[:-1])})
    batch_params = SamplingParams(top_k=1, repetition_penalty=BATCH_RP, early_stop_num=EARLY_STOP)
    items = [(phones, bert), (batch1_phones, batch1_bert)]
    voice = VoicePrompt(prompt, np.zeros((SOVITS_DIMS[4], 1), np.float32), phones[:n], bert[:, :n])
    batched = generate(gpt, [SemanticRequest(ph[n:], b[:, n:], voice, batch_params) for ph, b in items])
    for i, ((ph, b), toks) in enumerate(zip(items, batched)):
        naive = naive_generate(gpt, ph, b, prompt, batch_params)
        assert np.array_equal(naive, toks) and len(toks) < EARLY_STOP, "a batched item must stop by EOS"
        io.update({f"batch{i}_phone_ids": ph, f"batch{i}_bert_feature": b,
                   f"batch{i}_y": np.concatenate([prompt, toks]), f"batch{i}_idx": np.array(len(toks)),
                   f"batch{i}_naive_y": np.concatenate([prompt, naive])[None],
                   f"batch{i}_naive_idx": np.array(len(naive))})
    np.savez(out / "gpt_io.npz", **io)

    # ---- sampler
    sampling: dict[str, np.ndarray] = {}
    for c, (params, vocab) in enumerate(SAMPLING_CASES):
        logits = (2.0 * rng.standard_normal((3, vocab))).astype(np.float32)
        prev = rng.integers(0, vocab, (3, 25)).astype(np.int64)
        probs = logits_to_probs(torch.as_tensor(logits), torch.as_tensor(prev), **params).numpy()
        sampling.update({f"case{c}_logits": logits, f"case{c}_previous_tokens": prev, f"case{c}_probs": probs,
                         f"case{c}_params": np.array(json.dumps(params))})
    np.savez(out / "sampling_io.npz", **sampling)

    # ---- SoVITS: upstream's savee layout (enc_q dropped, fp16) with a pickled utils.HParams config
    sovits_path = out / "sovits_variant_v2.pth"
    sovits_config = tiny.sovits_config(SIZE)
    sovits_config["data"]["exp_dir"] = "logs/golden-variant"
    info = "2epoch_300iteration"
    _save_with_hparams({"weight": tiny.sovits_state_dict(SIZE, seed + 1), "config": sovits_config, "info": info},
                       sovits_path)
    sovits_ckpt = load_sovits_checkpoint(sovits_path)
    sovits = SoVITSDecoder.from_checkpoint(sovits_ckpt)
    t = np.arange(max(REF_SAMPLES, REF2_SAMPLES)) / 32000
    tone = (0.4 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    refer = (tone[:REF_SAMPLES] + 0.05 * rng.standard_normal(REF_SAMPLES)).astype(np.float32)[None]
    refer2 = (0.7 * tone[:REF2_SAMPLES] + 0.08 * rng.standard_normal(REF2_SAMPLES)).astype(np.float32)[None]
    codes = rng.integers(0, 1024, (1, 1, N_CODES)).astype(np.int64)
    text = rng.integers(1, tiny.N_PHONES, (1, N_TEXT)).astype(np.int64)
    ssl = rng.standard_normal((1, 768, SSL_FRAMES)).astype(np.float32)
    with torch.inference_mode():
        c, x = torch.as_tensor(codes), torch.as_tensor(text)
        spec, spec2 = linear_spectrogram(refer), linear_spectrogram(refer2)
        ge, ge2 = sovits.ref_style(spec), sovits.ref_style(spec2)
        enc_x, m_p, logs_p = sovits.encode_prior(c, x, ge)
        eps = torch.as_tensor(rng.standard_normal(tuple(m_p.shape)).astype(np.float32))
        _, m_p_fast, _ = sovits.encode_prior(c, x, ge, speed=SPEED)
        wav = sovits.decode(c, x, ge, noise_scale=0.0)
        s_io = {
            "codes": codes, "text": text, "refer_spec": spec, "refer_wav": refer, "refer2_spec": spec2,
            "refer2_wav": refer2, "wav_ns0": wav, "ge": ge, "enc_p_x": enc_x, "m_p": m_p, "logs_p": logs_p,
            "y_mask": torch.ones(1, 1, m_p.shape[-1]), "z": sovits.flow_reverse(m_p, ge), "eps": eps,
            "wav_ns05_eps": sovits.decode(c, x, ge, noise_scale=NOISE, eps=eps),
            "wav_ns0_speed125": sovits.decode(c, x, ge, speed=SPEED, noise_scale=0.0), "m_p_speed125": m_p_fast,
            "wav_ns0_tworefs": sovits.decode(c, x, mean_style([ge, ge2]), noise_scale=0.0), "ge_refer2": ge2,
            "ssl_feature": ssl, "ssl_codes": sovits.extract_latent(torch.as_tensor(ssl)),
            "codes_dequantized": sovits.dequantize(c),
        }
    s_io = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in s_io.items()}
    peak = float(np.abs(s_io["wav_ns0"]).max())
    assert 0.01 < peak < 0.99, f"the variant's waveform peaks at {peak}: not a usable reference"
    np.savez(out / "sovits_io.npz", **s_io)

    # ---- spectrogram
    wav_s = rng.uniform(-0.9, 0.9, (1, SPEC_SAMPLES)).astype(np.float32)
    spec_s = linear_spectrogram(wav_s).numpy()
    np.savez(out / "spectrogram_io.npz", wav=wav_s, spec=spec_s)
    shutil.copy(ROOT / "tests" / "data" / "golden" / "symbols_v2.json", out / "symbols_v2.json")

    gpt_ckpt = load_gpt_checkpoint(gpt_path)
    meta = {
        "profile": "variant (tests/tools/make_golden_variant.py): NOT upstream outputs, see its docstring",
        "seed": seed,
        "gpt_model_seed": model_seed,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "n_symbols_v2": tiny.N_PHONES,
        "gpt": {
            "file": gpt_path.name,
            "config_model": gpt_ckpt.config["model"],
            "max_sec": gpt_ckpt.config["data"]["max_sec"],
            "n_params": int(sum(t.numel() for t in gpt_ckpt.state_dict.values())),
            "state_dict_keys_sample": [f"model.{k}" for k in list(gpt_ckpt.state_dict)[:12]],
            "greedy": greedy_meta,
            "reffree_generated_len": len(free),
            "reffree": {"early_stop_num": REFFREE_STOP, "repetition_penalty": REFFREE_RP},
            "batch": {"early_stop_num": EARLY_STOP, "repetition_penalty": BATCH_RP},
            "batch_vs_naive_equal": [True, True],
        },
        "sovits": {
            "file": sovits_path.name,
            "config_type": "utils.HParams",
            "config_model": sovits_ckpt.config["model"],
            "config_data": sovits_ckpt.config["data"],
            "missing_keys_on_load": ["enc_q"],
            "n_params_saved": int(sum(t.numel() for t in sovits_ckpt.state_dict.values())),
            "info": info,
            "shapes": {k: list(v.shape) for k, v in s_io.items()},
        },
        "spectrogram": {"wav_shape": list(wav_s.shape), "spec_shape": list(spec_s.shape)},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    (out / "README.md").write_text(
        "# A golden-format variant set (NOT conformance data)\n\n"
        "Written by `tests/tools/make_golden_variant.py` with this project's own implementation, in the shared "
        "set's formats but with other sizes, seeds, prompt split and lengths. It proves the tests take every fact "
        "from the data; it proves nothing about upstream. The call parameters no array holds are in `meta.json` "
        "(`gpt.reffree`, `gpt.batch`).\n", encoding="utf-8")
    meta["files"] = sorted(p.name for p in out.iterdir())
    (out / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write (created; files in it are replaced)")
    parser.add_argument("--seed", type=int, default=7321, help="data seed; the GPT seed search starts here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    meta = write_variant(args.out, args.seed)
    g = meta["gpt"]
    log.info("wrote %s: GPT %s, greedy lengths %s, reference-free %d tokens, SoVITS gin %d",
             args.out, GPT_DIMS, {k: v["generated_len"] for k, v in g["greedy"].items()},
             g["reffree_generated_len"], meta["sovits"]["config_model"]["gin_channels"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
