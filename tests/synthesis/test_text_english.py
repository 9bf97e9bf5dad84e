"""English front-end: what is read better than upstream on purpose (issue 31), the POS tagger, homographs, lexicon.

Upstream conformance itself is checked phone for phone by test_text_conformance.py against the golden text set;
the table here holds the readings where upstream is wrong (its quirk kinds and the cases issue 31 lists), as
input -> normalised text.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from synthesis.text import english, english_lexicon, text_to_phonemes
from synthesis.text.english_lexicon import cmu, homographs, pick_homograph, title_words
from synthesis.text.english_tagger import pos_tags
from synthesis.text.symbols import symbols

BEYOND_UPSTREAM = [
    # clock times: no invented "a.m."; am/pm read as letters when written (upstream: "seven thirty a.m.")
    ("Let's meet at 7:30 tomorrow.", "Let's meet at seven thirty tomorrow."),
    ("Back by 8:15 or so", "Back by eight fifteen or so"),
    ("See you at 7:05", "See you at seven oh five"),
    ("It starts at 6:00 sharp", "It starts at six o'clock sharp"),
    ("Meet me at 5pm.", "Meet me at five P M."),
    ("Call at 3:30pm please", "Call at three thirty P M please"),
    ("The show is at 9 p.m. See you there.", "The show is at nine P M. See you there."),
    ("Lunch at 11 a.m. tomorrow", "Lunch at eleven A M tomorrow"),
    ("The train leaves at 14:15.", "The train leaves at two fifteen P M."),
    # Dr./St. by position, abbreviated weekdays (upstream: "drive", "mon")
    ("Dr. Smith said I should rest until Mon.", "Doctor Smith said I should rest until Monday."),
    ("Hi Dr. Lee!", "Hi Doctor Lee!"),
    ("I live on Elm Dr. near the park.", "I live on Elm Drive near the park."),
    ("Take Elm Dr. It's faster.", "Take Elm Drive. It's faster."),
    ("We flew to St. Louis.", "We flew to Saint Louis."),
    ("Main St. is closed.", "Main Street is closed."),
    ("Until Tue. at noon.", "Until Tuesday at noon."),
    # decades (upstream: "nineteen ninety seconds")
    ("Music from the 1990s was better.", "Music from the nineteen nineties was better."),
    ("I grew up in the 2000s.", "I grew up in the two thousands."),
    ("Songs from the 90s and the '80s", "Songs from the nineties and the eighties"),
    ("She is in her 20s.", "She is in her twenties."),
    ("Wait 30s please", "Wait thirty seconds please"),  # a unit, as upstream reads it
    # 10k, 2x
    ("That's 10k steps, 2x more", "That's ten thousand steps, two times more"),
    ("A $10k bonus and a €2.5M deal", "A ten thousand dollars bonus and a two point five million euros deal"),
    # phone numbers digit by digit
    ("Call 555-123-4567 now", "Call five five five, one two three, four five six seven now"),
    ("My number is +1 415 555 0100.", "My number is plus one, four one five, five five five, zero one zero zero."),
    ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
    # e-mail addresses and URLs
    ("Email me at john.doe@example.com.", "Email me at john dot doe at example dot com."),
    ("Visit https://www.example.com/docs.", "Visit w w w dot example dot com slash docs."),
    ("Go to github.com for the code", "Go to github dot com for the code"),
    # currency signs and codes (upstream drops all but $ and £)
    ("I paid €20.", "I paid twenty euros."),
    ("It's ¥500.", "It's five hundred yen."),
    ("₹1,500 only", "fifteen hundred rupees only"),
    ("₩10000 please", "ten thousand won please"),
    ("₽300, ₺50, ₪40, ₫20000", "three hundred rubles, fifty lira, forty shekels, twenty thousand dong"),
    ("50¢ each", "fifty cents each"),
    ("USD 5 or 5 EUR or GBP 3.50", "five U S dollars or five euros or three pounds and fifty pence"),
    # versions
    ("Update to v2.1.3 today.", "Update to version two point one point three today."),
    # curly apostrophes (upstream means to fold them but drops them: "Im", "dont")
    ("I\u2019m sure it\u2019s John\u2019s", "I'm sure it's John's"),
]


@pytest.mark.parametrize(("text", "norm"), BEYOND_UPSTREAM)
def test_beyond_upstream_readings(text: str, norm: str) -> None:
    assert english.normalize(text) == norm


def _phones(text: str) -> str:
    table = symbols()
    return " ".join(table[i] for i in text_to_phonemes(text, "en").ids)


def test_read_in_the_past_is_red() -> None:
    """The tagger calls "I read ... last year" VBP and "have you read" VB (upstream: R IY1 D); both are R EH1 D."""
    phones = _phones("I read that book last year, and now I want to read it again.")
    assert phones.startswith("AY1 R EH1 D ") and " T UW1 R IY1 D " in phones
    assert _phones("I read every day.").startswith("AY1 R IY1 D ")
    assert _phones("Have you read it?").startswith("HH AE1 V Y UW1 R EH1 D ")
    assert _phones("I have to read it.").startswith("AY1 HH AE1 V T UW1 R IY1 D ")


@pytest.mark.parametrize(
    ("text", "word", "reading"),
    [
        ("I want to record a video.", "record", "R IH0 K AO1 R D"),  # verb
        ("She set a new record.", "record", "R EH1 K ER0 D"),  # noun
        ("We present the results today.", "present", "P R IY0 Z EH1 N T"),
        ("He gave me a present.", "present", "P R EH1 Z AH0 N T"),
        ("Please close the door.", "close", "K L OW1 Z"),
        ("The store is close to here.", "close", "K L OW1 S"),
    ],
)
def test_homograph_follows_the_tag(text: str, word: str, reading: str) -> None:
    norm = english.normalize(text)
    tokens = norm.rstrip(".").split()
    tag = pos_tags(tokens)[tokens.index(word)]
    assert pick_homograph(homographs()[word], tag) == reading.split()
    assert reading in " ".join(english.g2p(norm))


def test_pick_homograph_prefix_rule() -> None:
    """A tag that starts with the entry's tag, or is a prefix of it, picks the first reading (upstream's rule)."""
    read = homographs()["read"]
    assert pick_homograph(read, "VBP") == ["R", "IY1", "D"]
    assert pick_homograph(read, "VB") == ["R", "IY1", "D"]  # VB is a prefix of VBP
    assert pick_homograph(read, "VBD") == ["R", "EH1", "D"]
    assert pick_homograph(homographs()["object"], "VBZ") == pick_homograph(homographs()["object"], "V")
    assert pick_homograph(homographs()["complex"], "JJ")[-3:] == ["EH1", "K", "S"]


def test_tagger_equals_nltk() -> None:
    """The decoder here gives nltk's PerceptronTagger's tags with the same weights."""
    perceptron = pytest.importorskip("nltk.tag.perceptron")
    from synthesis.text.english_tagger import _model

    model = _model()
    reference = perceptron.PerceptronTagger(load=False)
    reference.decode_json_params((model.weights, model.tagdict, list(model.classes)))
    for sentence in [
        "We need three more players , so invite twelve people just in case .",
        "I read that book last year , and now I want to read it again .",
        "The twenty-first of May 1999 was 3 days after the 2 o'clock meeting !",
        "Don't wind the clock , the wind is strong .",
    ]:
        words = sentence.split()
        assert pos_tags(words) == [tag for _, tag in reference.tag(words)]


def test_the_dictionary_reads_into_the_v2_table() -> None:
    table = symbols()
    lexicon = cmu()
    assert "os" not in lexicon and "ai" not in lexicon  # upstream reads these acronyms letter by letter
    assert lexicon["json"] == "JH EY1 S AH0 N".split()  # upstream's hot words, with or without its files
    assert all(phones and all(p in table for p in phones) for phones in lexicon.values())


def _upstream_files(folder: Path, names: object) -> None:
    """Upstream's four English files, in its formats, with a few words each (its header is 56 lines)."""
    header = [";;; header line"] * english_lexicon.CMU_HEADER_LINES
    (folder / "cmudict.rep").write_text("\n".join([*header, "INFORMATION  IH2 N F AO2 R M EY1 SH AH0 N",
                                                   "OFFICE  AO1 F AH0 S"]) + "\n", encoding="utf-8")
    (folder / "cmudict-fast.rep").write_text("OFFICE AO1 F IH0 S\nZOOMER Z UW1 M ER0\n", encoding="utf-8")
    (folder / "engdict-hot.rep").write_text("OFFICE AA1 F IH0 S\n", encoding="utf-8")
    with open(folder / "namedict_cache.pickle", "wb") as f:
        pickle.dump(names, f)


def test_upstreams_own_dictionaries_are_read_where_installed(tmp_path: Path) -> None:
    """CMUdict 0.7b first, the fast list's new words, hot words over both; Title-case words from the name list."""
    _upstream_files(tmp_path, {"meh": [["M", "EH1"]]})
    english_lexicon.configure(tmp_path)
    try:
        table = cmu()
        assert table["information"] == "IH2 N F AO2 R M EY1 SH AH0 N".split()  # 0.7b, not the wheel's IH2 N F ER0
        assert table["zoomer"] == "Z UW1 M ER0".split() and table["office"] == "AA1 F IH0 S".split()
        assert english.g2p(english.normalize("Meh, fine."))[:2] == ["M", "EH1"]
    finally:
        english_lexicon.configure(None)
    assert cmu()["information"] != "IH2 N F AO2 R M EY1 SH AH0 N".split()  # the wheel's again
    assert english.g2p(english.normalize("Meh, fine."))[:2] == ["EH1", "M"]  # no name list: spelled
    assert english.g2p("meh") == ["EH1", "M", "IY1", "EY1", "CH"]  # lower-case: spelled, as upstream does


def test_a_name_list_that_is_not_plain_data_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _upstream_files(tmp_path, {"meh": [["M", "EH1"]], "x": Path("/")})  # a pickle that names a class
    english_lexicon.configure(tmp_path)
    try:
        assert title_words() == {} and "not plain data" in caplog.text
        assert cmu()["information"] == "IH2 N F AO2 R M EY1 SH AH0 N".split()
    finally:
        english_lexicon.configure(None)


def test_hyphenated_words_are_looked_up_whole() -> None:
    """CMU has "twenty-five" with a secondary stress on five; splitting at the hyphen would give AY1."""
    assert english.g2p("twenty-five")[-3:] == ["F", "AY2", "V"]


def test_without_the_tagger_english_is_read_and_homographs_take_their_first_reading(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from synthesis.text import english_tagger

    monkeypatch.setattr(english_tagger, "_model_dirs", lambda: [tmp_path])
    english_tagger._model.cache_clear()  # pyright: ignore[reportPrivateUsage]
    try:
        assert english_tagger.pos_tags(["I", "read", "here"]) == ["", "", ""]
        assert "no part-of-speech tagger" in caplog.text
        entry = homographs()["close"]  # an adjective here (K L OW1 S); without a tagger the verb's K L OW1 Z
        assert english.g2p(english.normalize("Stay close."))[3:7] == list(entry.when_tagged)
    finally:
        monkeypatch.undo()
        english_tagger._model.cache_clear()  # pyright: ignore[reportPrivateUsage]
    assert english.g2p(english.normalize("Stay close."))[3:7] == list(entry.otherwise)  # with the tagger
