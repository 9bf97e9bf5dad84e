"""The golden conformance data, read in one place: every fact a test needs about it comes from here.

A golden set is the folder the golden README describes (``tests/data/golden``, or ``$VOICEBOT_GOLDEN_DIR``):
``gpt_io.npz``, ``sovits_io.npz``, ``spectrogram_io.npz``, ``sampling_io.npz``, ``meta.json`` and the two checkpoints
it names. :class:`Golden` reads them all and derives what the tests use (prompt split, stop limits, lengths,
shapes, sizes) from the arrays, ``meta.json`` and the checkpoints' own configs, so the suite holds on any set made
the same way (``tests/tools/make_golden_variant.py`` writes one with other sizes to prove it).

Two call parameters are not carried by any array: the reference-free run's ``early_stop_num`` and repetition
penalty, and the batched run's. They are read from ``meta.json`` (``gpt.reffree`` / ``gpt.batch``) where the set
has them; the shared set states them only in its README (the "Reference-free" and "Batched path" bullets), so there
they are read from that text. The greedy runs' penalty is in their array names (``greedy_rp135_*``: 1.35), the
SoVITS speed and noise cases' values in theirs (``wav_ns0_speed125``: speed 1.25, ``wav_ns05_eps``: noise 0.5).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import EOS_TOKEN, SamplingParams, SemanticRequest, VoicePrompt

__all__ = ["Golden", "GreedyCase", "golden_dir", "penalised", "greedy_choices", "teacher_forced_logits"]

GOLDEN_ENV = "VOICEBOT_GOLDEN_DIR"
DEFAULT_DIR = Path(__file__).resolve().parent / "data" / "golden"
FILES = ("gpt_io.npz", "sovits_io.npz", "spectrogram_io.npz", "sampling_io.npz", "meta.json")
MIN_STEPS_BEFORE_EOS = 11  # upstream cuts the EOS column for steps 0..10 (reference 5.4), in every golden run


def golden_dir() -> Path:
    """The golden folder: ``$VOICEBOT_GOLDEN_DIR`` when set, else ``tests/data/golden``."""
    return Path(os.environ.get(GOLDEN_ENV) or DEFAULT_DIR)


@dataclass(frozen=True)
class GreedyCase:
    """One greedy (top_k 1) upstream run along which logits and margins were recorded.

    Attributes
    ----------
    key: the array-name tag (``"rp135"``; ``"reffree"`` for the reference-free run).
    repetition_penalty: the run's penalty.
    phones: ``[Tx]`` int64, every phone the GPT saw (prompt's + target's).
    bert: ``[1024, Tx]`` float32.
    prompt: ``[Tp]`` int64 prompt tokens (empty: reference-free).
    generated: ``[n]`` int64, upstream's returned tokens.
    logits_raw: ``[steps, V]`` float32 raw head output per step (row 0 after the prefill), before cut and penalty.
    early_stop_num: the run's limit.
    stopped_by_eos: whether the run ended by EOS (else by ``early_stop_num``).
    """

    key: str
    repetition_penalty: float
    phones: np.ndarray
    bert: np.ndarray
    prompt: np.ndarray
    generated: np.ndarray
    logits_raw: np.ndarray
    early_stop_num: int
    stopped_by_eos: bool

    @property
    def fed(self) -> np.ndarray:
        """The tokens fed back after each step that has a recorded row: ``[steps - 1]`` int64."""
        return self.generated[: len(self.logits_raw) - 1]

    @property
    def expected_choices(self) -> list[int]:
        """Upstream's greedy choice at each recorded step: the tokens, then EOS where the run stopped by it."""
        if self.stopped_by_eos:
            return [*self.fed.tolist(), EOS_TOKEN]
        return self.generated[: len(self.logits_raw)].tolist()

    def params(self, seed: int | None = 0) -> SamplingParams:
        return SamplingParams(top_k=1, repetition_penalty=self.repetition_penalty,
                              early_stop_num=self.early_stop_num, seed=seed)

    def margins(self) -> np.ndarray:
        """``[steps]`` top-1/top-2 gap of upstream's penalised logits (recomputed from the raw ones)."""
        return np.array([m for _, m in greedy_choices(self.logits_raw, self.prompt, self.fed,
                                                      self.repetition_penalty)])


class Golden:
    """A golden data set, fully read (a few MB) and checked complete on construction.

    Parameters
    ----------
    directory: the set's folder.

    Raises
    ------
    FileNotFoundError
        naming the missing file and the variable that points at another set.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        missing = [f for f in FILES if not (self.dir / f).is_file()]
        if missing:
            raise FileNotFoundError(f"golden set {self.dir} lacks {', '.join(missing)}; point {GOLDEN_ENV} at a "
                                    f"complete set (see tests/data/golden/README.md)")
        self.gpt_io = _npz(self.dir / "gpt_io.npz")
        self.sovits_io = _npz(self.dir / "sovits_io.npz")
        self.spectrogram_io = _npz(self.dir / "spectrogram_io.npz")
        self.sampling_io = _npz(self.dir / "sampling_io.npz")
        self.meta: dict[str, Any] = json.loads((self.dir / "meta.json").read_text(encoding="utf-8"))
        self.gpt_path = self.dir / self.meta["gpt"]["file"]
        self.sovits_path = self.dir / self.meta["sovits"]["file"]
        for path in (self.gpt_path, self.sovits_path):
            if not path.is_file():
                raise FileNotFoundError(f"golden set {self.dir}: meta.json names {path.name}, which is missing")
        readme = self.dir / "README.md"
        self._readme = readme.read_text(encoding="utf-8") if readme.is_file() else ""

    # ------------------------------------------------------------------------------------------- checkpoints
    @cached_property
    def gpt_checkpoint(self) -> Any:
        """The GPT file through the project's loader (its ``config`` is the file's own)."""
        from engines.gpt_sovits.checkpoint import load_gpt_checkpoint

        return load_gpt_checkpoint(self.gpt_path)

    @cached_property
    def sovits_checkpoint(self) -> Any:
        from engines.gpt_sovits.checkpoint import load_sovits_checkpoint

        return load_sovits_checkpoint(self.sovits_path)

    @property
    def gpt_config(self) -> dict[str, Any]:
        """The GPT checkpoint's ``config["model"]`` (embedding_dim, head, n_layer, vocab sizes, EOS)."""
        return self.gpt_checkpoint.config["model"]

    @property
    def sovits_config(self) -> dict[str, Any]:
        """The SoVITS checkpoint's ``config["model"]`` (hidden/inter/gin channels, upsampling...)."""
        return self.sovits_checkpoint.config["model"]

    @property
    def sovits_data_config(self) -> dict[str, Any]:
        return self.sovits_checkpoint.config["data"]

    @property
    def gpt_n_params(self) -> int:
        """Parameters in the GPT file (meta.json)."""
        return int(self.meta["gpt"]["n_params"])

    @property
    def gpt_n_tensors(self) -> int:
        """Tensors in the GPT file from its config: 6 embedding/position + 12 per layer + the head."""
        return 7 + 12 * int(self.gpt_config["n_layer"])

    @property
    def sovits_n_params(self) -> int:
        """Parameters stored in the SoVITS file (meta.json ``n_params_saved``)."""
        return int(self.meta["sovits"]["n_params_saved"])

    @property
    def n_symbols(self) -> int:
        return int(self.meta["n_symbols_v2"])

    # --------------------------------------------------------------------------------------------------- GPT
    @property
    def phones(self) -> np.ndarray:
        """``[Tx]`` int64: prompt phones then target phones."""
        return self.gpt_io["phone_ids"][0]

    @property
    def bert(self) -> np.ndarray:
        """``[1024, Tx]`` float32."""
        return self.gpt_io["bert_feature"][0]

    @property
    def prompt_tokens(self) -> np.ndarray:
        """``[Tp]`` int64 prompt semantic tokens."""
        return self.gpt_io["prompt_semantic"][0]

    @property
    def n_prompt_phones(self) -> int:
        """How many of :attr:`phones` are the reference transcript's (array ``n_prompt_phones``)."""
        return int(self.gpt_io["n_prompt_phones"])

    @property
    def early_stop_num(self) -> int:
        """The greedy runs' limit (array ``early_stop_num``)."""
        return int(self.gpt_io["early_stop_num"])

    @property
    def target_phones(self) -> np.ndarray:
        return self.phones[self.n_prompt_phones:]

    @property
    def target_bert(self) -> np.ndarray:
        return self.bert[:, self.n_prompt_phones:]

    def voice(self, ge: np.ndarray | None = None) -> VoicePrompt:
        """The golden prompt as a voice (``ge`` defaults to the SoVITS set's ``ge``)."""
        n = self.n_prompt_phones
        return VoicePrompt(self.prompt_tokens, self.ge if ge is None else ge, self.phones[:n], self.bert[:, :n])

    def free_voice(self) -> VoicePrompt:
        """A reference-free voice (no prompt tokens or phones)."""
        return VoicePrompt(np.zeros(0, np.int64), self.ge, np.zeros(0, np.int64), np.zeros((self.bert.shape[0], 0),
                                                                                          np.float32))

    def request(self, case: GreedyCase, seed: int | None = 0) -> SemanticRequest:
        """The engine-level request of a greedy case (target phones + the golden voice, or reference-free)."""
        if case.prompt.size == 0:
            return SemanticRequest(case.phones, case.bert, self.free_voice(), case.params(seed))
        n = self.n_prompt_phones
        return SemanticRequest(case.phones[n:], case.bert[:, n:], self.voice(), case.params(seed))

    @cached_property
    def greedy(self) -> dict[str, GreedyCase]:
        """The prompted greedy runs by tag (``rp135``, ``rp100``...), penalty from the tag."""
        out = {}
        for name in sorted(self.gpt_io):
            m = re.fullmatch(r"greedy_rp(\d+)_generated", name)
            if not m:
                continue
            key = f"rp{m.group(1)}"
            gen = self.gpt_io[name]
            meta = self.meta["gpt"]["greedy"][key]
            assert int(self.gpt_io[f"greedy_{key}_idx"]) == len(gen) == int(meta["generated_len"])
            if not meta["stopped_by_eos"]:  # upstream then drops the first sampled token: the path is not recorded
                raise ValueError(f"golden set {self.dir}: greedy run {key} stopped by early_stop_num, not EOS; "
                                 "make the set with a limit the run does not reach")
            out[key] = GreedyCase(key, int(m.group(1)) / 100, self.phones, self.bert, self.prompt_tokens, gen,
                                  self.gpt_io[f"greedy_{key}_logits_raw"], self.early_stop_num,
                                  bool(meta["stopped_by_eos"]))
        if not out:
            raise ValueError(f"golden set {self.dir}: gpt_io.npz has no greedy_rp*_generated arrays")
        return out

    def top2_margin(self, key: str) -> np.ndarray:
        """The stored per-step top-2 margins of greedy run ``key``."""
        return self.gpt_io[f"greedy_{key}_top2_margin"]

    @cached_property
    def reffree(self) -> GreedyCase:
        """The reference-free run (no prompt): it returns every generated token, the limit's extra one included."""
        io = self.gpt_io
        gen = io["reffree_y"][0].astype(np.int64)
        limit = self._call_param("reffree", "early_stop_num", "Reference-free", int)
        return GreedyCase("reffree", self._call_param("reffree", "repetition_penalty", "Reference-free", float),
                          io["reffree_phone_ids"][0], io["reffree_bert_feature"][0], np.zeros(0, np.int64), gen,
                          io["reffree_logits_raw"], limit, stopped_by_eos=len(gen) <= limit)

    @property
    def batch_params(self) -> SamplingParams:
        """The batched run's sampling (greedy, its penalty and limit)."""
        return SamplingParams(top_k=1, repetition_penalty=self._call_param("batch", "repetition_penalty",
                                                                           "Batched path", float),
                              early_stop_num=self._call_param("batch", "early_stop_num", "Batched path", int), seed=0)

    @property
    def batch_items(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The batched run's items: ``(phones [Tx], bert [1024, Tx], upstream's new tokens [n])``."""
        out, tp, i = [], len(self.prompt_tokens), 0
        while f"batch{i}_phone_ids" in self.gpt_io:
            io = self.gpt_io
            y, idx = io[f"batch{i}_y"], int(io[f"batch{i}_idx"])
            assert len(y) == tp + idx and np.array_equal(io[f"batch{i}_naive_y"][0], y)
            out.append((io[f"batch{i}_phone_ids"], io[f"batch{i}_bert_feature"], y[tp:]))
            i += 1
        return out

    def _call_param(self, section: str, name: str, readme_bullet: str, kind: type) -> Any:
        """A call parameter no array carries: ``meta.json`` ``gpt.<section>.<name>``, else the README bullet."""
        value = self.meta["gpt"].get(section, {}).get(name)
        if value is not None:
            return kind(value)
        # The shared set states it only in its README, e.g. "Reference-free: ... `early_stop_num=20`, R=1.35".
        bullet = next((b for b in self._readme.split("\n* ") if b.lstrip("* ").startswith(readme_bullet)), "")
        pattern = {"early_stop_num": r"early_stop_num=(\d+)",
                   "repetition_penalty": r"(?:repetition_penalty|\bR)=([\d.]+\d)"}[name]
        m = re.search(pattern, bullet)
        if not m:
            raise ValueError(f"golden set {self.dir}: {name} of the {section} run is neither in meta.json "
                             f"(gpt.{section}.{name}) nor in the README's {readme_bullet!r} bullet")
        return kind(m.group(1))

    # ------------------------------------------------------------------------------------------------ SoVITS
    @property
    def ge(self) -> np.ndarray:
        """``[gin, 1]`` float32 style of the first reference."""
        return self.sovits_io["ge"][0]

    @property
    def gin(self) -> int:
        return int(self.sovits_io["ge"].shape[1])

    @property
    def codes(self) -> np.ndarray:
        """``[1, 1, Ts]`` int64 semantic tokens of the SoVITS cases."""
        return self.sovits_io["codes"]

    @property
    def frames(self) -> int:
        """50 Hz latent frames of the speed-1 cases (``m_p``'s length)."""
        return int(self.sovits_io["m_p"].shape[-1])

    @property
    def samples_per_token(self) -> int:
        """Output samples per semantic token, from the noise-free waveform's length."""
        n, t = self.sovits_io["wav_ns0"].shape[-1], self.codes.shape[-1]
        assert n % t == 0
        return n // t

    @property
    def sampling_rate(self) -> int:
        return int(self.sovits_data_config["sampling_rate"])

    @property
    def speed_cases(self) -> dict[str, float]:
        """``{"wav_ns0_speed125": 1.25, ...}``: the speed cases by array name."""
        return {k: int(m.group(1)) / 100 for k in self.sovits_io if (m := re.fullmatch(r"wav_ns0_speed(\d+)", k))}

    @property
    def noise_cases(self) -> dict[str, float]:
        """``{"wav_ns05_eps": 0.5}``: the stored-noise cases by array name (``ns05`` = 0.5)."""
        out = {}
        for k in self.sovits_io:
            if m := re.fullmatch(r"wav_ns(\d)(\d*)_eps", k):
                out[k] = float(f"{m.group(1)}.{m.group(2) or 0}")
        return out

    def last_flow_post(self) -> str:
        """The ``flow.flows.N.post`` prefix of the last flow step in the SoVITS file (a weight to remove)."""
        posts = sorted({int(m.group(1)) for k in self.sovits_checkpoint.state_dict
                        if (m := re.match(r"flow\.flows\.(\d+)\.post\.", k))})
        return f"flow.flows.{posts[-1]}.post"


# -------------------------------------------------------------------------------------- upstream's greedy view
def penalised(raw: np.ndarray, history: np.ndarray, rp: float, step: int) -> np.ndarray:
    """Upstream's greedy view of one step: the EOS column cut before step 11, the repetition penalty applied.

    ``raw`` is ``[V]`` raw logits, ``history`` the prompt + tokens so far; returns ``[V]`` (``[V-1]`` when cut).
    """
    x = (raw[:EOS_TOKEN] if step < MIN_STEPS_BEFORE_EOS else raw).astype(np.float64)
    if rp != 1.0:
        prev = np.unique(history)
        prev = prev[prev < len(x)]
        x[prev] = np.where(x[prev] < 0, x[prev] * rp, x[prev] / rp)
    return x


def greedy_choices(logits: np.ndarray, prompt: np.ndarray, fed: np.ndarray, rp: float) -> list[tuple[int, float]]:
    """Per step of ``logits [steps, V]``: upstream's penalised greedy choice and its top-2 margin."""
    out = []
    for step, raw in enumerate(logits):
        x = penalised(raw, np.concatenate([prompt, fed[:step]]), rp, step)
        top2 = np.sort(x)[-2:]
        out.append((int(np.argmax(x)), float(top2[1] - top2[0])))
    return out


def teacher_forced_logits(gpt: Any, phones: np.ndarray, bert: np.ndarray, prompt: np.ndarray, fed: np.ndarray,
                          slot: int = 0) -> np.ndarray:
    """Raw logits at every step of a GPT fed upstream's tokens: ``[len(fed) + 1, V]`` float32.

    ``gpt`` is anything with the decoder surface (``setup_caches``/``prefill``/``decode_step``: the torch model or
    an engine's graph GPT); ``slot`` > 0 decodes through slot addressing (torch model only).
    """
    import torch

    from engines.gpt_sovits.gpt import KV_BUCKET

    dev = gpt.device
    need = len(phones) + len(prompt) + len(fed) + 1
    kv_len = -(-need // KV_BUCKET) * KV_BUCKET  # the decoder's bucketed attention length
    with torch.inference_mode():
        gpt.setup_caches(slot + 1, kv_len)
        rows = [gpt.prefill(slot, *(torch.as_tensor(a, device=dev) for a in (phones, bert, prompt))).reshape(-1)]
        pos = len(phones) + len(prompt)
        slots = torch.tensor([slot], device=dev) if slot else None
        for i, tok in enumerate(fed):
            rows.append(gpt.decode_step(torch.tensor([int(tok)], device=dev), torch.tensor([pos + i], device=dev),
                                        slots, kv_len)[0])
        out = torch.stack(rows)
    assert out.dtype == torch.float32  # logits stay fp32 whatever the weights
    return out.cpu().numpy()


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}
