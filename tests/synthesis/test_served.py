"""``ray.storage: served`` without a cluster: the storage actor's class called in this process, through the replica's
stand-ins; what travels through Ray is proven on the real cluster (tests/cluster/test_replicas.py)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="ray[serve] is not installed: pip install 'voicebot[cluster]'")

from synthesis.cache import SynthesisCache, VoiceCache  # noqa: E402
from synthesis.cache_lane import CacheLane, SpeechCache  # noqa: E402
from synthesis.cluster.storage import ServedCache, ServedVoices, StorageActor  # noqa: E402
from synthesis.types import VoiceNotFound  # noqa: E402
from synthesis.voices import VoiceStore  # noqa: E402
from tests.synthesis.test_voices import create, make_prompt  # noqa: E402

MB = 1 << 20


class Direct:
    """The link of a replica, calling the actor's object here instead of through Ray; counts the voices sent."""

    def __init__(self, actor: StorageActor) -> None:
        self.actor = actor
        self.voices_sent = 0

    def call(self, method: str, *args: Any) -> Any:
        result = getattr(self.actor, method)(*args)
        if method == "voice" and result[1] is not None:
            self.voices_sent += 1
        return result

    send = call

    async def acall(self, method: str, *args: Any) -> Any:
        return self.call(method, *args)

    def sending(self) -> list:
        return []  # (every store is done when send returns)


@pytest.fixture
def served(tmp_path: Path):
    def open_stores() -> tuple[VoiceStore, SynthesisCache]:
        cache = SynthesisCache(tmp_path / "cache", MB, MB)
        return VoiceStore(tmp_path / "voices", cache=cache), cache

    actor = StorageActor(open_stores, str(tmp_path / "cache" / "replicas"))
    link = Direct(actor)
    cache = ServedCache(link, reuse_random=actor.cache.reuse_random)  # type: ignore[arg-type]
    yield actor, link, ServedVoices(link, actor.voices.root, cache), cache  # type: ignore[arg-type]
    actor.voices.close()
    actor.cache.close()


def test_the_stand_ins_override_every_public_method_of_what_they_stand_in_for(served):
    # (forget_deleted is pure: the held arrays and present(); lookup calls get, then find)
    public = {n for n, v in inspect.getmembers(VoiceStore, inspect.isfunction) if not n.startswith("_")}
    own = {n for n in vars(ServedVoices) if not n.startswith("_")}
    static = {n for n in public if isinstance(inspect.getattr_static(VoiceStore, n), staticmethod)}
    assert public - static - own == {"forget_deleted", "lookup"}, "a stand-in would reach for files it does not have"
    # the caches' stand-in is what the stages and the voice store ask of a cache, coroutines where the local one's are
    *_, cache = served
    for face in (SpeechCache, VoiceCache):
        for name in (n for n in vars(face) if not n.startswith("_")):
            assert hasattr(cache, name), name
            awaited = inspect.iscoroutinefunction(getattr(face, name, None))
            assert inspect.iscoroutinefunction(getattr(cache, name)) == awaited, name
            if face is SpeechCache:
                assert inspect.iscoroutinefunction(getattr(CacheLane, name)) == awaited, name


def test_a_voices_arrays_travel_once_per_version_and_go_with_a_replace_or_delete(served):
    actor, link, voices, _ = served
    made = create(actor.voices)
    first = voices.get(made.id)
    assert voices.get(made.id) is first and voices.find("Alice").id == made.id and link.voices_sent == 1

    actor.voices.replace(made.id, make_prompt(seed=5))  # another process (the client) replaces it
    second = voices.get(made.id)
    assert link.voices_sent == 2 and second.version == 2
    assert np.array_equal(second.prompt.ge, make_prompt(seed=5).ge)

    actor.voices.delete(made.id)
    with pytest.raises(VoiceNotFound):
        voices.get(made.id)
    again = create(actor.voices, seed=3)  # a new voice of the same name: never the old arrays
    assert voices.find("Alice").id == again.id and link.voices_sent == 3


def test_a_voice_looked_up_by_id_or_name_comes_from_the_actor_as_locally(served):
    actor, link, voices, _ = served
    made = create(actor.voices)
    assert voices.lookup(made.id) is voices.lookup("alice") and voices.lookup("ALICE").id == made.id
    assert link.voices_sent == 1  # the arrays travelled once, whichever way the voice was named
    with pytest.raises(VoiceNotFound, match="no voice named 'bob'"):
        voices.lookup("bob")
    assert actor.voices.lookup("Alice").id == made.id  # the store's own, on the actor's side


async def test_cache_calls_reach_the_actors_cache_and_a_deleted_voice_is_refused(served):
    actor, _, voices, cache = served
    made = create(actor.voices)
    await cache.put_tokens("k", np.arange(5), made.id)
    await cache.put_audio("a", np.ones(8, np.float32), made.id)
    assert np.array_equal(await cache.get_tokens("k"), np.arange(5))
    assert np.array_equal(actor.cache.get_audio("a"), np.ones(8, np.float32))
    audio = await cache.get_audio("a")
    assert audio is not None and audio.flags.writeable
    assert (await cache.stats())["prosody"]["entries"] == 1
    removed = voices.delete(made.id)
    assert removed.cache_entries == 2 and await cache.get_tokens("k") is None and cache.is_retired(made.id)
    await cache.put_tokens("k", np.arange(5), made.id)  # a request in flight when its voice went
    assert actor.cache.get_tokens("k") is None


def test_the_actor_writes_replica_states_with_its_own_clock(served):
    import json
    import time

    actor, *_ = served
    actor.report("r1", {"replica": "r1", "at": 0.0, "healthy": True})
    path = Path(actor.reports.folder) / "r1.json"
    assert abs(json.loads(path.read_text())["at"] - time.time()) < 60
    actor.remove_report("r1")
    assert not path.exists()


def test_a_deleted_voices_arrays_leave_a_replica_that_never_asks_for_it_again(served):
    actor, _, voices, _ = served
    kept, gone = create(actor.voices), create(actor.voices, name="Bob", seed=2)
    voices.get(kept.id), voices.get(gone.id)
    assert voices.forget_deleted() == 0
    actor.voices.delete(gone.id)  # through another replica or the client
    assert voices.forget_deleted() == 1 and voices._held.ids() == [kept.id]  # white-box: the arrays held here
    # the same for a local store whose voice another process deleted
    local = VoiceStore(actor.voices.root, cache=actor.cache)
    local.get(kept.id)
    actor.voices.delete(kept.id)
    assert local.forget_deleted() == 1 and not len(local._held)
    local.close()
