"""The GPT-SoVITS v2 phone table (732 symbols): phone strings <-> ids.

The table is upstream's ``text/symbols2.py`` list, stored as data in ``symbols_v2.json``; a phone's id is its index.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np

SYMBOLS_FILE = Path(__file__).with_name("symbols_v2.json")
NUM_SYMBOLS = 732  # v2 table size (v1 had 322)
UNK = "UNK"  # stand-in for any phone the table lacks
PUNCTUATION = ("!", "?", "…", ",", ".")  # punctuation that is a phone of its own
PAD = "_"


@lru_cache(maxsize=1)
def symbols() -> tuple[str, ...]:
    """The 732 phone strings, index = id."""
    table = json.loads(SYMBOLS_FILE.read_text(encoding="utf-8"))
    assert len(table) == NUM_SYMBOLS, f"{SYMBOLS_FILE} holds {len(table)} symbols, expected {NUM_SYMBOLS}"
    return tuple(table)


@lru_cache(maxsize=1)
def symbol_ids() -> dict[str, int]:
    """Phone string -> id."""
    return {s: i for i, s in enumerate(symbols())}


def phones_to_ids(phones: Iterable[str]) -> np.ndarray:
    """Map phone strings to ids; phones outside the table become ``UNK``.

    Returns
    -------
    ``[T]`` int64 ids in ``0..731``.
    """
    table = symbol_ids()
    unk = table[UNK]
    return np.fromiter((table.get(p, unk) for p in phones), dtype=np.int64)
