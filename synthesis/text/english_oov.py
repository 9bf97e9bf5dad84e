"""g2p_en's neural reading of words no dictionary has, re-implemented in numpy.

The GRU encoder-decoder's weights (``checkpoint20.npz``) ship in the ``g2p_en`` wheel; importing ``g2p_en`` itself
would call ``nltk.download``, so the wheel's folder is located and only the weights are read.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import TextError
from .symbols import UNK

MAX_DECODE_STEPS = 20  # g2p_en's cap on predicted phones per word

_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
# g2p_en's output vocabulary: 4 specials + sorted stressed ARPAbet (+ a bare "UW"), 74 entries.
_G2P_PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + sorted(
    [v + s for v in _VOWELS for s in "012"] + _CONSONANTS + ["UW"]
)
_G2P_GRAPHEMES = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
_G2P_DROP = {"<pad>", "<s>", "</s>", "UW"}  # predictions upstream discards
class _NeuralG2P:
    """g2p_en's GRU encoder-decoder (``checkpoint20.npz``), greedy decoding, numpy float32."""

    def __init__(self, path: Path) -> None:
        w = np.load(path)
        self.enc_emb = w["enc_emb"]  # [29, H] grapheme embeddings
        self.enc = (w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])  # [3H, H], [3H, H], [3H], [3H]
        self.dec_emb = w["dec_emb"]  # [74, H] phoneme embeddings
        self.dec = (w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
        self.fc_w, self.fc_b = w["fc_w"], w["fc_b"]  # [74, H], [74]
        assert self.enc_emb.shape[0] == len(_G2P_GRAPHEMES) and self.fc_w.shape[0] == len(_G2P_PHONEMES)

    @staticmethod
    def _gru_step(x: np.ndarray, h: np.ndarray, p: tuple[np.ndarray, ...]) -> np.ndarray:
        """One GRU cell step (PyTorch gate order r, z, n): x [E], h [H] -> [H]."""
        w_ih, w_hh, b_ih, b_hh = p
        gi = w_ih @ x + b_ih  # [3H]
        gh = w_hh @ h + b_hh  # [3H]
        n_h = h.shape[0]
        r = 1.0 / (1.0 + np.exp(-(gi[:n_h] + gh[:n_h])))
        z = 1.0 / (1.0 + np.exp(-(gi[n_h : 2 * n_h] + gh[n_h : 2 * n_h])))
        n = np.tanh(gi[2 * n_h :] + r * gh[2 * n_h :])
        return (1.0 - z) * n + z * h

    def predict(self, word: str) -> list[str]:
        """Lower-case letters -> ARPAbet phones (stress digits included)."""
        g_idx = {g: i for i, g in enumerate(_G2P_GRAPHEMES)}
        ids = [g_idx.get(c, 1) for c in word] + [g_idx["</s>"]]
        h = np.zeros(self.enc_emb.shape[1], np.float32)  # [H]
        for i in ids:
            h = self._gru_step(self.enc_emb[i], h, self.enc)
        prev = _G2P_PHONEMES.index("<s>")
        out: list[str] = []
        for _ in range(MAX_DECODE_STEPS):
            h = self._gru_step(self.dec_emb[prev], h, self.dec)
            prev = int(np.argmax(self.fc_w @ h + self.fc_b))
            if _G2P_PHONEMES[prev] == "</s>":
                break
            out.append(_G2P_PHONEMES[prev])
        return [UNK if p == "<unk>" else p for p in out if p not in _G2P_DROP]


@lru_cache(maxsize=1)
def _neural() -> _NeuralG2P:
    """The fallback model, located inside the installed g2p_en wheel without importing it."""
    spec = importlib.util.find_spec("g2p_en")
    if spec is None or not spec.submodule_search_locations:
        raise TextError("English needs the 'g2p-en' package (its wheel ships the OOV model): pip install g2p-en")
    return _NeuralG2P(Path(list(spec.submodule_search_locations)[0]) / "checkpoint20.npz")


def predict_oov(word: str) -> list[str]:
    """Pronounce a word that no dictionary has, with the neural model."""
    return _neural().predict(word.lower())


