"""Write the sentences the int8 GPT is proven on (``engines/gpt_sovits/proof_sentences.json``) from our own front-end.

    .venv/bin/python tests/tools/proof_sentences.py        (rewrites the file)

The engines may not import the front-end (it lives in synthesis/), so its phone ids for a few built-in sentences are
kept as data beside the GPT; tests/engines/test_gpt_int8_model_proof.py builds them again with :func:`build` and
compares, so the file cannot drift from the front-end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

OUT = Path(__file__).resolve().parents[2] / "engines" / "gpt_sovits" / "proof_sentences.json"
SCHEMA = 1
# one everyday sentence per language the front-end reads (written for this proof)
SENTENCES = (
    ("en", "The train leaves at seven, so we should hurry."),
    ("zh", "明天早上我们一起去图书馆看书吧。"),
    ("ja", "駅までは歩いて十分ぐらいかかります。"),
    ("ko", "오늘 저녁에는 친구들과 함께 영화를 볼 거예요."),
    ("yue", "我哋聽日一齊去飲茶好唔好？"),
)


def build_one(lang: str, text: str) -> dict[str, Any]:
    """One sentence's entry: its language, text and the front-end's phone ids."""
    from synthesis.text.frontend import text_to_phonemes

    return {"lang": lang, "text": text, "phones": [int(i) for i in text_to_phonemes(text, lang).ids]}


def build() -> dict[str, Any]:
    """The whole file's content."""
    return {"schema": SCHEMA,
            "about": "phone ids of synthesis.text.text_to_phonemes, written by tests/tools/proof_sentences.py; the "
                     "proof feeds zero BERT features for every language",
            "sentences": [build_one(lang, text) for lang, text in SENTENCES]}


def render(content: dict[str, Any]) -> str:
    """The file's text: one line per sentence, so a change shows as one line in a diff."""
    rows = ",\n".join("  " + json.dumps(s, ensure_ascii=False) for s in content["sentences"])
    head = {k: v for k, v in content.items() if k != "sentences"}
    return json.dumps(head, ensure_ascii=False)[:-1] + f', "sentences": [\n{rows}\n]}}\n'


def main() -> None:
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(render(build()), encoding="utf-8")
    tmp.replace(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
