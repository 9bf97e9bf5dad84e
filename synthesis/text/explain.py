"""What will be said: a text's sentences, their language pieces and phones, with the dictionary entries used.

The one report behind ``python -m bot phonemes``, the HTTP API's ``/phonemes`` and ``/pronounce``'s answer, so
a user sees exactly what the pipeline will give the model.
"""

from __future__ import annotations

from typing import Any

from .frontend import text_to_phonemes
from .lexicon import Lexicon
from .split import split_sentences
from .symbols import symbols


def explain_text(text: str, language: str = "auto", lexicon: Lexicon | None = None,
                 split_method: str = "cut5") -> dict[str, Any]:
    """Split ``text`` as the pipeline does and run the front-end on each sentence.

    Returns
    -------
    ``{"text", "language", "sentences": [{"text", "norm_text", "phones", "dictionary", "pieces": [{"text",
    "lang", "norm_text", "phones", "word2ph", "source"}]}]}``: ``phones`` are v2 phone strings, ``dictionary``
    the entries that matched (``"Nguyen → “win”"``), ``source`` ``"g2p"`` or ``"dictionary"``.

    Raises
    ------
    TextError
        What the pipeline would refuse (empty text, an unknown language).
    """
    table = symbols()
    sentences: list[dict[str, Any]] = []
    for sentence in split_sentences(text, split_method, language):
        ph = text_to_phonemes(sentence, language, lexicon)
        used = lexicon.rewrite(sentence).used if lexicon else ()
        sentences.append({
            "text": sentence,
            "norm_text": ph.norm_text,
            "phones": [table[int(i)] for i in ph.ids],
            "dictionary": [e.describe() for e in used],
            "pieces": [{"text": p.text, "lang": p.lang, "norm_text": p.norm_text,
                        "phones": [table[int(i)] for i in ph.ids[p.start:p.end]],
                        "word2ph": list(p.word2ph) if p.word2ph is not None else None,
                        "source": "dictionary" if p.fixed else "g2p"} for p in ph.pieces],
        })
    return {"text": text, "language": language, "sentences": sentences}
