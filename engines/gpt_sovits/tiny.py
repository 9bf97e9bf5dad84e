"""Write a complete GPT-SoVITS v2 (or v2Pro/v2ProPlus) model set with seeded random weights, in upstream's formats.

Used by tests (``size="tiny"``: small and quick) and benchmarks (``size="real"``: the released v2 dimensions), so the
real loaders and the real runtime run anywhere without downloads. The folder mirrors the released layout::

    gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt   GPT (.ckpt, fp16, "model." prefix)
    gsv-v2final-pretrained/s2G2333k.pth                                        SoVITS (.pth, fp16, no enc_q)
    chinese-hubert-base/                 config.json, preprocessor_config.json, pytorch_model.bin (fp16)
    chinese-roberta-wwm-ext-large/       config.json, pytorch_model.bin (fp16), tokenizer files

Random weights are shaped to behave like a model, not to sound like one: the GPT gets a constant EOS logit offset (and
damped residual branches) so generation stops after about 11-60 tokens, and the SoVITS output is audible (RMS about
0.1-0.2) and not clipped.
HuBERT and BERT stay small in ``"real"`` mode (they are not what a benchmark of the GPT/SoVITS measures) unless
``full=True``, which writes the released architectures (about 0.8 GB in all).

``family="v2Pro"``/``"v2ProPlus"`` writes that family's SoVITS instead (upstream's ``s2v2Pro.json`` /
``s2v2ProPlus.json`` changes, the ``sv_emb``/``prelu``/``ge_to512`` weights, the ``05``/``06`` version tag) and the
speaker-verification model it needs (``sv/pretrained_eres2netv2w24s4ep4.ckpt``, fp16); at ``"real"`` size both have
the released files' tensor names and shapes (``tests/data/golden-v2pro/real_size_shapes.json``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, cast

import torch

from engines.base import BERT_DIM, EOS_TOKEN
from engines.gpt_sovits.checkpoint import tagged_checkpoint
from engines.gpt_sovits.family import DIT_FAMILIES
from engines.gpt_sovits.sovits import CODEBOOK_SIZE, SSL_DIM, SovitsConfig, SoVITSDecoder
from engines.gpt_sovits.sv import ERes2NetV2

log = logging.getLogger(__name__)

__all__ = ["write_model_set", "MODEL_SET_LAYOUT", "SV_LAYOUT"]

# Relative paths inside a model set (the same as the released files, so ``models.dir`` can point at either).
MODEL_SET_LAYOUT = {
    "gpt": "gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
    "sovits": "gsv-v2final-pretrained/s2G2333k.pth",
    "hubert": "chinese-hubert-base",
    "bert": "chinese-roberta-wwm-ext-large",
}
SV_LAYOUT = "sv/pretrained_eres2netv2w24s4ep4.ckpt"  # the SV model of a v2Pro/v2ProPlus set
FAMILIES = ("v2", "v2Pro", "v2ProPlus", "v3", "v4", "v5dev", "v5turbo")
# What v2Pro/v2ProPlus change in the SoVITS config (upstream configs/s2v2Pro.json, s2v2ProPlus.json): gin 1024 at the
# real size (tiny keeps its gin), upsample_initial_channel (x1.5 in v2ProPlus) and the first upsample kernel 16 -> 20.
V2PRO_GIN = {"tiny": 128, "real": 1024}
V2PRO_UPSAMPLE = {"v2Pro": (1, 16), "v2ProPlus": (1.5, 20)}  # (initial channel factor, first kernel size)
V2PRO_MRTE = 512  # the MRTE's width, ge_to512's output (upstream hard-codes 512)
V2PRO_TAG = {"v2Pro": b"05", "v2ProPlus": b"06"}  # upstream my_save2: the zip's "PK" replaced by the version
SV_M_CHANNELS = {"tiny": 6, "real": 64}  # ERes2NetV2 stem width: released 64 (features 20480); tiny 6 (1920)
SV_EMBEDDING = 192  # the unused speaker-embedding head seg_1's width (kept: the released file has it)
N_PHONES = 732  # v2 symbol table
N_TOKENS = 1025  # 1024 semantic codes + EOS
# The random model sets' sizes: "real" = the released v2 models, "tiny" = a small set for CI and quick runs (these
# are this writer's sizes, not the golden conformance data's: tests read those from the data's own configs).
GPT_SIZES = {"tiny": (96, 4, 3), "real": (512, 16, 24)}  # (width, heads, layers)
SOVITS_SIZES = {  # (inter=hidden, filter, heads, layers, gin, upsample_initial_channel)
    "tiny": (64, 256, 2, 2, 128, 64),
    "real": (192, 768, 2, 6, 512, 512),
}
# Attention and FFN outputs are scaled down so the residual stream keeps the input through 24 post-LN layers; at
# full scale a random deep post-LN stack forgets its input and every step gives the same logits.
BRANCH_GAIN = 0.25
# Logit added to EOS at every step, so random weights stop after a few dozen tokens (tuned by measurement).
EOS_LOGIT_OFFSET = {"tiny": 2.5, "real": 2.7}
EOS_ROW_SCALE = 0.3  # the input-dependent part of the EOS logit, kept small so the stop step varies less
HUBERT_TINY: dict[str, Any] = dict(conv_dim=(32,) * 7, num_hidden_layers=1, intermediate_size=64, num_conv_pos_embeddings=16)
BERT_TINY_LAYERS = 2  # hidden_states then has 3 entries, so hidden_states[-3] exists
BERT_TINY_INTERMEDIATE = 64
BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CJK_PUNCTUATION = "。，、；：？！“”‘’（）《》【】…—·～"  # full-width marks, as in the released vocab
FILE_MODE = 0o644  # mkstemp creates 0600; model files are meant to be readable
CJK_FIRST, CJK_LAST = 0x4E00, 0x9FA5  # the hanzi range the zh front-end keeps
# Weight-normed convs in upstream's SynthesizerTrn (stored as weight_g / weight_v)
_WEIGHT_NORMED = re.compile(r"^(dec\.(ups|resblocks)\.|flow\.flows\.\d+\.enc\.(in_layers|res_skip_layers|cond_layer))")


def write_model_set(
    directory: str | os.PathLike[str], size: str = "tiny", seed: int = 0, full: bool = False,
    family: str = "v2",
) -> dict[str, Path]:
    """Write a GPT + SoVITS + HuBERT + BERT model set with seeded random weights.

    Parameters
    ----------
    directory:
        target folder (created); files are written atomically (temp file + rename).
    size:
        ``"tiny"`` (GPT 96/4/3, SoVITS 64/64/256/2/2 gin 128) or ``"real"`` (the released v2 sizes).
    seed:
        the same seed gives byte-identical weights.
    full:
        with ``size="real"``, also write HuBERT and BERT at their released sizes (otherwise they stay tiny).
    family:
        ``"v2"``, or ``"v2Pro"``/``"v2ProPlus"``: that family's SoVITS (same path) and its SV model; or
        ``"v3"``/``"v4"``/``"v5dev"``/``"v5turbo"``: the GPT at ``s1v3.ckpt`` and that family's SoVITS and vocoder at
        their released paths (:mod:`engines.gpt_sovits.tiny_dit`).

    Returns
    -------
    dict
        ``{"gpt": Path, "sovits": Path, "hubert": Path, "bert": Path}`` (files for the first two, folders after),
        and ``"sv"`` (a file) for v2Pro/v2ProPlus, ``"vocoder"`` (a file; v3: a folder) for v3/v4/v5.
    """
    if size not in GPT_SIZES:
        raise ValueError(f"size must be 'tiny' or 'real', got {size!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    root = Path(directory)
    paths = {name: root / rel for name, rel in MODEL_SET_LAYOUT.items()}
    big = size == "real" and full
    if family in DIT_FAMILIES:
        from engines.gpt_sovits.tiny_dit import GPT_LAYOUT, write_dit_family

        paths["gpt"] = root / GPT_LAYOUT
        _write_gpt(paths["gpt"], size, seed)
        paths.update(write_dit_family(root, family, size, seed + 1, _atomic))
    else:
        _write_gpt(paths["gpt"], size, seed)
        _write_sovits(paths["sovits"], size, seed + 1, family)
    if family in V2PRO_TAG:
        paths["sv"] = root / SV_LAYOUT
        sd = sv_state_dict(size, seed + 4)
        _atomic(paths["sv"], lambda tmp: torch.save(sd, tmp))
    _write_hubert(paths["hubert"], seed + 2, big)
    _write_bert(paths["bert"], seed + 3, big)
    log.info("wrote a %s random model set (seed %d) to %s", size, seed, root)
    return paths


# ------------------------------------------------------------------------------------------------------- GPT
def gpt_config(size: str) -> dict[str, Any]:
    """An ``s1longer-v2.yaml``-like config dict for a GPT of ``size``."""
    dim, heads, layers = GPT_SIZES[size]
    return {
        "train": {"seed": 1234, "epochs": 1, "batch_size": 8, "save_every_n_epoch": 1, "precision": "16-mixed",
                  "gradient_clip": 1.0, "if_save_every_weights": True, "if_save_latest": True, "if_dpo": False,
                  "half_weights_save_dir": "GPT_weights_v2", "exp_name": f"random-{size}"},
        "optimizer": {"lr": 0.01, "lr_init": 1e-05, "lr_end": 0.0001, "warmup_steps": 2000, "decay_steps": 40000},
        "data": {"max_eval_sample": 8, "max_sec": 54, "num_workers": 4, "pad_val": EOS_TOKEN},
        "model": {"vocab_size": N_TOKENS, "phoneme_vocab_size": N_PHONES, "embedding_dim": dim, "hidden_dim": dim,
                  "head": heads, "linear_units": 4 * dim, "n_layer": layers, "dropout": 0, "EOS": EOS_TOKEN,
                  "random_bert": 0},
        "inference": {"top_k": 15},
        "pretrained_s1": "GPT_SoVITS/pretrained_models/gsv-v2final-pretrained/"
                         "s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
        "train_semantic_path": f"logs/random-{size}/6-name2semantic.tsv",
        "train_phoneme_path": f"logs/random-{size}/2-name2text.txt",
        "output_dir": f"logs/random-{size}/logs_s1_v2",
    }


def gpt_state_dict(size: str, seed: int) -> OrderedDict[str, torch.Tensor]:
    """Seeded random GPT weights with upstream's names (``model.`` prefix) and shapes, fp16."""
    dim, _, layers = GPT_SIZES[size]
    gen = torch.Generator().manual_seed(seed)
    randn: Callable[..., torch.Tensor] = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    sd: OrderedDict[str, torch.Tensor] = OrderedDict()
    sd["bert_proj.weight"] = randn(dim, BERT_DIM) / math.sqrt(BERT_DIM)
    sd["bert_proj.bias"] = 0.05 * randn(dim)
    sd["ar_text_embedding.word_embeddings.weight"] = 0.5 * randn(N_PHONES, dim)
    sd["ar_text_position.alpha"] = torch.ones(1)
    sd["ar_audio_embedding.word_embeddings.weight"] = randn(N_TOKENS, dim)
    sd["ar_audio_position.alpha"] = torch.ones(1)
    for i in range(layers):
        p = f"h.layers.{i}."
        sd[p + "self_attn.in_proj_weight"] = randn(3 * dim, dim) / math.sqrt(dim)
        sd[p + "self_attn.in_proj_bias"] = 0.05 * randn(3 * dim)
        sd[p + "self_attn.out_proj.weight"] = BRANCH_GAIN * randn(dim, dim) / math.sqrt(dim)
        sd[p + "self_attn.out_proj.bias"] = 0.05 * randn(dim)
        sd[p + "linear1.weight"] = randn(4 * dim, dim) / math.sqrt(dim)
        sd[p + "linear1.bias"] = 0.05 * randn(4 * dim)
        sd[p + "linear2.weight"] = BRANCH_GAIN * randn(dim, 4 * dim) / math.sqrt(4 * dim)
        sd[p + "linear2.bias"] = 0.05 * randn(dim)
        for n in ("norm1", "norm2"):
            sd[p + n + ".weight"] = 1.0 + 0.1 * randn(dim)
            sd[p + n + ".bias"] = 0.05 * randn(dim)
    head = randn(N_TOKENS, dim) / math.sqrt(dim)
    # A constant EOS bias: channel 0 of the last layer norm is pinned to 1 (gain 0, bias 1) and read only by the EOS
    # row, so EOS gets a fixed logit offset and every other logit is left as random as before.
    last = f"h.layers.{layers - 1}.norm2."
    sd[last + "weight"][0] = 0.0
    sd[last + "bias"][0] = 1.0
    head[:, 0] = 0.0
    head[EOS_TOKEN] *= EOS_ROW_SCALE
    head[EOS_TOKEN, 0] = EOS_LOGIT_OFFSET[size]
    sd["ar_predict_layer.weight"] = head
    return OrderedDict(("model." + k, v.half()) for k, v in sd.items())


def _write_gpt(path: Path, size: str, seed: int) -> None:
    """GPT ``.ckpt`` as upstream's ``my_save`` writes it: ``{"weight", "config", "info"}``."""
    ckpt: OrderedDict[str, Any] = OrderedDict(weight=gpt_state_dict(size, seed), config=gpt_config(size), info="GPT-e1")
    _atomic(path, lambda tmp: torch.save(ckpt, tmp))


# ---------------------------------------------------------------------------------------------------- SoVITS
def sovits_config(size: str, family: str = "v2") -> dict[str, Any]:
    """An ``s2.json``-like config (plain dicts, as the pretrained files hold) for a SoVITS of ``size``; v2Pro and
    v2ProPlus with their configs' changes (see :data:`V2PRO_UPSAMPLE`)."""
    hidden, filt, heads, layers, gin, upc = SOVITS_SIZES[size]
    kernels = [16, 16, 8, 2, 2]
    if family != "v2":
        factor, kernels[0] = V2PRO_UPSAMPLE[family]
        gin, upc = V2PRO_GIN[size], int(upc * factor)
    return {
        "train": {"log_interval": 100, "eval_interval": 500, "seed": 1234, "epochs": 1, "learning_rate": 0.0001,
                  "betas": [0.8, 0.99], "eps": 1e-09, "batch_size": 4, "fp16_run": True, "lr_decay": 0.999875,
                  "segment_size": 20480, "init_lr_ratio": 1, "warmup_epochs": 0, "c_mel": 45, "c_kl": 1.0,
                  "text_low_lr_rate": 0.4},
        "data": {"max_wav_value": 32768.0, "sampling_rate": 32000, "filter_length": 2048, "hop_length": 640,
                 "win_length": 2048, "n_mel_channels": 128, "mel_fmin": 0.0, "mel_fmax": None, "add_blank": True,
                 "n_speakers": 300, "cleaned_text": True},
        "model": {"inter_channels": hidden, "hidden_channels": hidden, "filter_channels": filt, "n_heads": heads,
                  "n_layers": layers, "kernel_size": 3, "p_dropout": 0.1 if family == "v2" else 0.0, "resblock": "1",
                  "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5]] * 3,
                  "upsample_rates": [10, 8, 2, 2, 2], "upsample_initial_channel": upc,
                  "upsample_kernel_sizes": kernels, "n_layers_q": 3, "use_spectral_norm": False,
                  "gin_channels": gin, "semantic_frame_rate": "25hz", "freeze_quantizer": True, "version": family},
        "s2_ckpt_dir": f"logs/random-{size}",
        "content_module": "cnhubert",
        "version": family,
    }


def sovits_state_dict(size: str, seed: int, family: str = "v2") -> dict[str, torch.Tensor]:
    """Seeded random SoVITS weights with upstream's names (weight-normed convs as ``weight_g``/``weight_v``), fp16."""
    config = sovits_config(size, family)
    m = config["model"]
    pro = family != "v2"
    cfg = SovitsConfig(
        inter_channels=m["inter_channels"], hidden_channels=m["hidden_channels"],
        filter_channels=m["filter_channels"], n_heads=m["n_heads"], n_layers=m["n_layers"],
        kernel_size=m["kernel_size"], resblock_kernel_sizes=tuple(m["resblock_kernel_sizes"]),
        resblock_dilation_sizes=tuple(tuple(d) for d in m["resblock_dilation_sizes"]),
        upsample_rates=tuple(m["upsample_rates"]), upsample_initial_channel=m["upsample_initial_channel"],
        upsample_kernel_sizes=tuple(m["upsample_kernel_sizes"]), gin_channels=m["gin_channels"],
        n_symbols=N_PHONES, mrte_hidden=V2PRO_MRTE if pro else m["gin_channels"],
        sv_dim=ERes2NetV2(SV_M_CHANNELS[size]).out_dim if pro else 0, version=family,
    )
    gen = torch.Generator().manual_seed(seed)
    shapes = {k: tuple(v.shape) for k, v in SoVITSDecoder(cfg).state_dict().items()}
    sd: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        leaf = name.rsplit(".", 1)[-1]
        if name == "codebook":
            sd["quantizer.vq.layers.0._codebook.embed"] = 0.6 * noise
        elif leaf == "gamma":
            sd[name] = 1.0 + 0.1 * noise
        elif leaf in ("beta", "bias"):
            sd[name] = 0.05 * noise
        elif leaf.startswith("emb_rel_"):
            sd[name] = noise / math.sqrt(shape[-1])
        elif name == "enc_p.text_embedding.weight":
            sd[name] = 0.5 * noise
        elif name == "prelu.weight":
            sd[name] = 0.25 + 0.05 * noise  # PReLU's usual slope
        else:
            w = noise / math.sqrt(math.prod(shape[1:]))
            if _WEIGHT_NORMED.match(name):
                stem = name[: -len(".weight")]
                sd[stem + ".weight_v"] = w
                norm = cast(torch.Tensor, w.flatten(1).norm(dim=1))  # pyright: ignore[reportUnknownMemberType]
                sd[stem + ".weight_g"] = (1.0 + 0.1 * torch.randn(shape[0], generator=gen)).view(-1, 1, 1) * (
                    norm.view(-1, 1, 1)
                )
            else:
                sd[name] = w
    sd["quantizer.vq.layers.0._codebook.inited"] = torch.ones(1)
    sd["quantizer.vq.layers.0._codebook.cluster_size"] = torch.full((CODEBOOK_SIZE,), 26.0)
    sd["quantizer.vq.layers.0._codebook.embed_avg"] = 26.0 * sd["quantizer.vq.layers.0._codebook.embed"]
    return {k: v.half() for k, v in sd.items()}


def _write_sovits(path: Path, size: str, seed: int, family: str = "v2") -> None:
    """SoVITS ``.pth`` as upstream's ``savee`` writes it (``enc_q`` dropped), with a plain-dict config; a v2Pro or
    v2ProPlus file carries its version tag in place of the zip's ``PK`` (upstream ``my_save2``)."""
    ckpt = {"weight": sovits_state_dict(size, seed, family), "config": sovits_config(size, family),
            "info": "1epoch_1iteration"}
    if family == "v2":
        _atomic(path, lambda tmp: torch.save(ckpt, tmp))
        return
    data = tagged_checkpoint(ckpt, V2PRO_TAG[family])

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    _atomic(path, write)


def sv_state_dict(size: str, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random ERes2NetV2 weights as upstream's pretrained SV file holds them: a plain state dict, floats fp16,
    BatchNorm statistics included, and the unused speaker-embedding head ``seg_1``."""
    model = ERes2NetV2(SV_M_CHANNELS[size])
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            sd[name] = torch.tensor(1000, dtype=torch.long)
        elif leaf == "running_var":
            sd[name] = torch.ones(t.shape)
        elif leaf == "running_mean" or leaf == "bias":
            sd[name] = torch.zeros(t.shape)
        elif t.ndim == 1:  # BatchNorm scales
            sd[name] = torch.ones(t.shape)
        else:
            sd[name] = torch.randn(t.shape, generator=gen) / math.sqrt(math.prod(t.shape[1:]))
    stats = 2 * model.out_dim  # TSTP pooling: mean and standard deviation
    sd["seg_1.weight"] = torch.randn(SV_EMBEDDING, stats, generator=gen) / math.sqrt(stats)
    sd["seg_1.bias"] = torch.zeros(SV_EMBEDDING)
    return {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}


# ---------------------------------------------------------------------------------------------- HuBERT, BERT
def _write_hubert(folder: Path, seed: int, full: bool) -> None:
    """A ``chinese-hubert-base``-layout folder: 768 wide (ssl_proj needs it), 1 layer unless ``full``."""
    from transformers import HubertConfig, HubertModel, Wav2Vec2FeatureExtractor

    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # transformers initialises from the global RNG
    config = HubertConfig(hidden_size=SSL_DIM, architectures=["HubertModel"], **({} if full else HUBERT_TINY))
    model = HubertModel(config).eval()
    extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=False
    )
    _write_hf_folder(folder, model, [extractor])


def _bert_vocab() -> list[str]:
    """BertTokenizer vocab: specials, ASCII punctuation and digits/letters, then every hanzi (one token each)."""
    ascii_tokens = [chr(c) for c in range(0x21, 0x7F)]
    return [*BERT_SPECIAL, *ascii_tokens, *CJK_PUNCTUATION, *(chr(c) for c in range(CJK_FIRST, CJK_LAST + 1))]


def _write_bert(folder: Path, seed: int, full: bool) -> None:
    """A ``chinese-roberta-wwm-ext-large``-layout folder: BertForMaskedLM 1024 wide, 2 layers unless ``full``."""
    # (transformers 5 keeps BertTokenizerFast as a runtime alias that its type information lacks)
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast  # pyright: ignore[reportAttributeAccessIssue, reportUnknownVariableType]

    vocab = _bert_vocab()
    tokenizer = BertTokenizerFast(  # pyright: ignore[reportUnknownVariableType]
        vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True, tokenize_chinese_chars=True
    )
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # (its seed parameter is untyped)
    layers: dict[str, Any] = dict(num_hidden_layers=24, intermediate_size=4096) if full else dict(
        num_hidden_layers=BERT_TINY_LAYERS, intermediate_size=BERT_TINY_INTERMEDIATE
    )
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=BERT_DIM, num_attention_heads=16, max_position_embeddings=512,
        architectures=["BertForMaskedLM"], **layers,
    )
    model = BertForMaskedLM(config).eval()
    # vocab.txt as well as tokenizer.json, so slow and fast tokenizers (any transformers version) both load it
    _write_hf_folder(folder, model, [tokenizer], {"vocab.txt": "\n".join(vocab) + "\n"})


def _write_hf_folder(folder: Path, model: Any, extras: list[Any], texts: dict[str, str] | None = None) -> None:
    """Write config.json, fp16 ``pytorch_model.bin`` (the released layout), processors and text files, atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
    try:
        model.config.dtype = "float16"
        model.config.save_pretrained(staging)
        torch.save(_half_shared(model.state_dict()), staging / "pytorch_model.bin")
        for extra in extras:
            extra.save_pretrained(staging)
        for name, text in (texts or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
        for item in sorted(staging.iterdir()):
            os.replace(item, folder / item.name)
    finally:
        for item in staging.iterdir():
            item.unlink()
        staging.rmdir()


def _half_shared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp16 copies of a state dict; tied tensors (e.g. BERT's decoder = word embeddings) stay one storage."""
    done: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        key = t.data_ptr()
        if key not in done:
            done[key] = t.detach().half().contiguous()
        out[name] = done[key]
    return out


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    """Write a file via a temp file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
