"""Prosody and audio caches: keys, hits and misses, bounded LRU eviction, persistence, invalidation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from synthesis.cache import SynthesisCache, normalise_text

SAMPLING = {"top_k": 15, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.35, "seed": 7}
KB = 1024


def key(text: str = "Hello there.", voice: str = "v1", version: int = 1, **sampling: object) -> str:
    return SynthesisCache.prosody_key("model-a", voice, version, text, "en", {**SAMPLING, **sampling})


@pytest.fixture
def cache(tmp_path: Path) -> SynthesisCache:
    c = SynthesisCache(tmp_path / "cache", prosody_bytes=4 * 1024 * KB, audio_bytes=4 * 1024 * KB)
    yield c
    c.close()


def test_keys_cover_every_input() -> None:
    base = key()
    assert len(base) == 64 and base == key()
    assert key(text="Hello  there. ") == base  # whitespace is not prosody
    variants = {
        key(text="Hello there!"), key(voice="v2"), key(version=2), key(seed=8), key(top_k=5), key(temperature=0.9),
        SynthesisCache.prosody_key("model-b", "v1", 1, "Hello there.", "en", SAMPLING),
        SynthesisCache.prosody_key("model-a", "v1", 1, "Hello there.", "ja", SAMPLING),
    }
    assert base not in variants and len(variants) == 8
    a = SynthesisCache.audio_key(base, 1.0, 0.5, 7)
    assert a != SynthesisCache.audio_key(base, 1.1, 0.5, 7) != SynthesisCache.audio_key(base, 1.0, 0.5, 8)
    assert a != SynthesisCache.audio_key(base, 1.0, 0.6, 7) and a == SynthesisCache.audio_key(base, 1, 0.5, 7)
    assert SynthesisCache.audio_key(base, 1.0, 0.5, "any") not in (a, SynthesisCache.audio_key(base, 1.0, 0.5, -1))
    assert normalise_text("  a\u0301\tb \n") == "\u00e1 b"


def test_random_seed_policy(tmp_path: Path) -> None:
    reuse = SynthesisCache(tmp_path / "a", KB * KB, KB * KB)
    fresh = SynthesisCache(tmp_path / "b", KB * KB, KB * KB, reuse_random=False)
    assert reuse.cacheable({**SAMPLING, "seed": -1}) and fresh.cacheable({**SAMPLING, "seed": 3})
    assert not fresh.cacheable({**SAMPLING, "seed": -1}) and not fresh.cacheable({**SAMPLING, "seed": "any"})
    assert fresh.cacheable({**SAMPLING, "seed": -1, "top_k": 1})  # greedy is deterministic
    reuse.close()
    fresh.close()


def test_hit_and_miss(cache: SynthesisCache) -> None:
    k = key()
    assert cache.get_tokens(k) is None
    tokens = np.array([3, 1024, 0, 517, 9], np.int64)
    cache.put_tokens(k, tokens, "v1")
    got = cache.get_tokens(k)
    assert got is not None and got.dtype == np.int64
    np.testing.assert_array_equal(got, tokens)
    ak = SynthesisCache.audio_key(k, 1.0, 0.5, 7)
    assert cache.get_audio(ak) is None
    audio = np.linspace(-1, 1, 32000, dtype=np.float32)
    cache.put_audio(ak, audio, "v1")
    np.testing.assert_array_equal(cache.get_audio(ak), audio)
    s = cache.stats()
    assert (s["prosody"]["hits"], s["prosody"]["misses"], s["prosody"]["entries"]) == (1, 1, 1)
    assert (s["audio"]["hits"], s["audio"]["misses"], s["audio"]["entries"]) == (1, 1, 1)
    assert s["audio"]["bytes"] >= audio.nbytes and s["audio"]["limit"] == 4 * 1024 * KB
    with pytest.raises(ValueError, match="semantic tokens must be in 0..32767"):
        cache.put_tokens(k, np.array([-1]), "v1")


def test_bounded_lru_eviction(tmp_path: Path) -> None:
    limit = 1024 * KB
    c = SynthesisCache(tmp_path / "c", prosody_bytes=limit, audio_bytes=limit)
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal(25_000).astype(np.float32)  # 100 KB per entry, stored as a file
    keys = [SynthesisCache.audio_key(key(text=f"sentence {i}"), 1.0, 0.5, 7) for i in range(40)]
    c.put_audio(keys[0], chunk, "v1")
    for i, k in enumerate(keys[1:], 1):
        assert c.get_audio(keys[0]) is not None, f"the most recently used entry was evicted at {i}"
        c.put_audio(k, chunk + i, "v1")
    s = c.stats()["audio"]
    assert s["entries"] < 15  # 40 x 100 KB written into 1 MB
    assert s["bytes"] <= limit + 2 * chunk.nbytes
    assert c.get_audio(keys[1]) is None  # least recently used: gone
    np.testing.assert_array_equal(c.get_audio(keys[-1]), chunk + 39)
    files = [p for p in (tmp_path / "c" / "audio").rglob("*.val")]
    assert len(files) == s["entries"]  # evicted entries leave no value file behind
    c.close()


def test_persistence_across_reopen(tmp_path: Path) -> None:
    c = SynthesisCache(tmp_path / "p", KB * KB, KB * KB)
    c.put_tokens(key(), np.arange(100), "v1")
    c.put_audio("a" * 64, np.ones(50_000, np.float32), "v1")
    c.close()
    c2 = SynthesisCache(tmp_path / "p", KB * KB, KB * KB)
    np.testing.assert_array_equal(c2.get_tokens(key()), np.arange(100))
    np.testing.assert_array_equal(c2.get_audio("a" * 64), np.ones(50_000, np.float32))
    c2.close()


def test_invalidate_voice_leaves_no_entry_or_byte(tmp_path: Path) -> None:
    c = SynthesisCache(tmp_path / "i", 4 * KB * KB, 4 * KB * KB)
    rng = np.random.default_rng(1)
    secret = rng.integers(0, 1024, 300)  # small: stored inside the SQLite file
    for i in range(5):
        c.put_tokens(key(text=f"t{i}", voice="gone"), secret, "gone")
        c.put_audio(f"gone-{i}", rng.standard_normal(20_000).astype(np.float32), "gone")  # 80 KB: value files
        c.put_tokens(key(text=f"t{i}", voice="kept"), np.arange(10), "kept")
    assert c.invalidate_voice("gone") == 10
    assert c.invalidate_voice("gone") == 0
    s = c.stats()
    assert s["prosody"]["entries"] == 5 and s["audio"]["entries"] == 0
    assert all(c.get_tokens(key(text=f"t{i}", voice="gone")) is None for i in range(5))
    np.testing.assert_array_equal(c.get_tokens(key(text="t0", voice="kept")), np.arange(10))
    c.close()
    # scan the data folder: no value files, no tagged rows, and the token bytes are not left in any file
    assert not list((tmp_path / "i").rglob("*.val"))
    for db in (tmp_path / "i").rglob("cache.db"):
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT COUNT(*) FROM Cache WHERE tag = 'gone'").fetchone() == (0,)
    pattern = secret.astype("<i2").tobytes()
    for f in (tmp_path / "i").rglob("*"):
        if f.is_file():
            assert pattern not in f.read_bytes(), f
