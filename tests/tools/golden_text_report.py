"""How closely the front-end follows upstream's phones: per language, exact matches on the golden text set.

    python tests/tools/golden_text_report.py [--lang en] [--show]   (VOICEBOT_GOLDEN_TEXT_DIR picks another set)

Compares ``text_to_phonemes(text, language)`` with each entry's ``inference`` ids (and, for zh/yue, each piece's
``word2ph``); prints the exact-match rate over all entries and over those without an upstream quirk, and with
``--show`` the first differing phones of every miss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from golden_text import LANGUAGES, load_language  # noqa: E402

from synthesis.text import text_to_phonemes  # noqa: E402
from synthesis.text.symbols import symbols  # noqa: E402


def compare(entry) -> str | None:  # type: ignore[no-untyped-def]
    """None when the front-end equals upstream's inference path, else a one-line difference."""
    try:
        ph = text_to_phonemes(entry.text, entry.language)
    except Exception as e:  # noqa: BLE001 - a report lists every failure
        return f"error: {e}"
    got = [int(i) for i in ph.ids]
    want = list(entry.inference_ids)
    table = symbols()
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        g = " ".join(table[x] for x in got[max(0, i - 3): i + 6])
        w = " ".join(table[x] for x in want[max(0, i - 3): i + 6])
        return f"ids differ at {i}: got [{g}] want [{w}]  (norm {ph.norm_text!r})"
    want_w2p = [tuple(s["word2ph"]) for s in entry.segments if s.get("word2ph")]
    got_w2p = [p.word2ph for p in ph.pieces if p.word2ph]
    if want_w2p and got_w2p != want_w2p:
        return f"word2ph differ: got {got_w2p} want {want_w2p}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lang", action="append", choices=LANGUAGES)
    ap.add_argument("--show", action="store_true", help="print each miss")
    args = ap.parse_args()
    for lang in args.lang or LANGUAGES:
        entries = load_language(lang)
        misses = {e.id: compare(e) for e in entries}
        plain = [e for e in entries if not e.quirk_in("inference")]
        ok_all = sum(1 for e in entries if misses[e.id] is None)
        ok_plain = sum(1 for e in plain if misses[e.id] is None)
        print(f"{lang}: exact {ok_all}/{len(entries)} of all, {ok_plain}/{len(plain)} without quirks")
        if args.show:
            for e in entries:
                if misses[e.id] is not None:
                    print(f"  {e.id}{' (quirk)' if e.quirk else ''} {e.text}\n      {misses[e.id]}")


if __name__ == "__main__":
    main()
