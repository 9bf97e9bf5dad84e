"""Synthesis replicas on a real local Ray cluster (a head and 2 worker nodes, one replica each), no mocks.

The tiny models of tests/conftest.py, engine threads 1 (so a replica and a local run compute alike), 2 requests per
replica (``synthesis.queue_size``), 4 requests waiting in Serve's queue (Serve counts a request that is being routed
as queued too, so a smaller queue would refuse some of 4 requests sent at once to free replicas). One deployment
for the whole module (on the cluster of tests/cluster/conftest.py); the test that kills a replica runs last.

The voices and caches are served (``ray.storage: served``): the storage actor on this process's node opens the
module's folders, and the replicas' own config points ``voices.dir`` and ``cache.dir`` below a plain file, where
nothing can be opened or made, so any direct access of theirs fails (with ``shared`` the replicas would not start).
tests/cluster/test_autoscaling.py runs on ``shared`` folders.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="ray[serve] is not installed: pip install 'voicebot[cluster]'")

from bot.services import build_synthesizer  # noqa: E402
from engines import EngineError  # noqa: E402
from synthesis import SynthesisParams  # noqa: E402
from synthesis.types import BusyError, VoiceNotFound  # noqa: E402
from tests.audio_samples import speech_like_wav  # noqa: E402
from tests.cluster.apps import cluster_config  # noqa: E402

# the cluster and the replicas start once for the module, inside the first test's time (minutes on a loaded 2-core
# machine: each replica imports torch and loads and warms up its engine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CONSENT = {"user_id": 1, "text": "this is my own voice"}
PARAMS = SynthesisParams(seed=7, language="en")
# a request that is still speaking whatever the machine's load: ~47,000 characters, a minute or more of the tiny
# model's work on one CPU, where the tests need it in flight for a second or two (they close it themselves)
LONG = " ".join(f"This is sentence number {i} of a long reading." for i in range(1000))


@pytest.fixture(scope="module")
def config(tiny_models, tmp_path_factory, cluster):
    return cluster_config(tiny_models, tmp_path_factory.mktemp("cluster-data"), cluster, num_replicas=2,
                          max_queued_requests=4, app_name="voicebot-test", storage="served")


@pytest.fixture(scope="module")
def replica_config(config, tmp_path_factory):
    """The replicas' view: their data folders below a plain file (nothing there can be opened or created)."""
    blocked = tmp_path_factory.mktemp("replica-view") / "not-a-folder"
    blocked.write_text("the replicas have no data folders\n")
    return dataclasses.replace(config, voices=dataclasses.replace(config.voices, dir=blocked / "voices"),
                               cache=dataclasses.replace(config.cache, dir=blocked / "cache"))


@pytest.fixture(scope="module")
def alice(remote):
    voice, _ = asyncio.run(remote.voicing.create("alice", speech_like_wav(), "alice.wav",
                                                 transcript="Hello, this is my voice.", language="en",
                                                 consent=CONSENT))
    return voice


async def run(synth, text, voice, params=PARAMS):
    """(chunks' audio, the replica that served it, or None for a local run)."""
    stream = synth.stream(text, voice, params)
    audio = [chunk.audio async for chunk in stream]
    return audio, getattr(stream, "served", None)


def entries(synth) -> dict[str, int]:
    """Entries in the prosody and audio caches (the storage actor's files, or the local run's, read here)."""
    return {name: s["entries"] for name, s in synth.voices.cache.stats().items()}


async def stored(synth, expected: dict[str, int], timeout_s: float = 30.0) -> None:
    """Wait until the caches hold ``expected`` entries: a replica sends its writes without waiting for them."""
    deadline = time.monotonic() + timeout_s
    while (found := entries(synth)) != expected:
        assert time.monotonic() < deadline, f"the caches hold {found}, not {expected}"
        await asyncio.sleep(0.05)


async def collect(stream) -> list:
    return [chunk async for chunk in stream]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """The same samples; the chunks may be cut differently (beside another request a first sentence's early words
    go out with the rest of it, see Synthesizer.stream)."""
    return np.array_equal(np.concatenate(a), np.concatenate(b))


async def test_concurrent_seeded_requests_are_spread_and_bit_identical_to_a_local_run(remote, local, alice):
    texts = [f"Replica test {i}. It speaks two sentences." for i in range(4)]
    together = await asyncio.gather(*(run(remote, t, alice.id) for t in texts))
    assert len({served.replica for _, served in together}) == 2  # 2 slots per replica: 4 requests need both
    for text, (audio, _) in zip(texts, together):
        solo, _ = await run(local, text, alice.id)
        assert len(solo) >= 2 and same(audio, solo)


async def test_a_voice_made_on_one_replica_speaks_on_the_other_and_its_delete_reaches_both(remote, local):
    bob, _ = await remote.voicing.create("bob", speech_like_wav(seed=3, f0=110), "bob.wav",
                                         transcript="Hello, this is my voice.", language="en", consent=CONSENT)
    made_on = remote.voicing.last_replica
    await local.cache.drain()  # (the local run queues its writes: every one in)
    before, local_before = entries(remote), entries(local)
    texts = [f"Bob talks, take {i}." for i in range(4)]
    results = await asyncio.gather(*(run(remote, t, "bob") for t in texts))  # by name: each replica's own lookup
    assert {served.replica for _, served in results} - {made_on}  # some were served by the other replica
    for text, (audio, _) in zip(texts, results):
        assert same(audio, (await run(local, text, bob.id))[0])
    # the entries the local run made in its own caches, the replicas made in the served ones
    await local.cache.drain()
    await stored(remote, {k: before[k] + entries(local)[k] - local_before[k] for k in before})
    assert entries(remote) != before

    await remote.voicing.delete(bob.id)
    assert entries(remote) == before  # bob's prosody and audio entries are gone, the rest stay
    assert remote.cache.invalidate_voice(bob.id) == 0
    for _ in range(2):  # both replicas (2 concurrent requests) find it gone
        outcomes = await asyncio.gather(*(run(remote, "Still there?", bob.id) for _ in range(2)),
                                        return_exceptions=True)
        assert all(isinstance(o, VoiceNotFound) for o in outcomes), outcomes


async def test_extra_clips_and_styles_are_made_on_a_replica_and_speak_as_a_local_run(remote, local, alice):
    carol, _ = await remote.voicing.create("carol", speech_like_wav(seed=5, f0=180), "carol.wav",
                                           transcript="Hello, this is my voice.", language="en", consent=CONSENT)
    carol, _ = await remote.voicing.add_clips(carol, [(speech_like_wav(seed=6, f0=200), "c2.wav")], consent=CONSENT)
    carol, _ = await remote.voicing.add_style(carol, "calm", speech_like_wav(seed=7, f0=120), "calm.wav",
                                              consent=CONSENT, transcript="I am calm.", language="en")
    assert carol.version == 3 and carol.clip_ges is not None and carol.clip_ges.shape[0] == 2
    assert list(carol.styles) == ["calm"]
    for params in (dataclasses.replace(PARAMS, style="calm"), dataclasses.replace(PARAMS, aux_voices=(alice.id,))):
        audio, _ = await run(remote, "A calm sentence.", carol.id, params)
        assert same(audio, (await run(local, "A calm sentence.", carol.id, params))[0])
    carol = await remote.voicing.remove_style(carol, "calm")
    assert carol.styles == {}
    await remote.voicing.delete(carol.id)


async def test_a_prosody_hit_on_another_replica_skips_the_gpt(remote, local, alice):
    text = "This sentence is computed once."
    before = entries(remote)
    stream = remote.stream(text, alice.id, PARAMS)
    first = [c async for c in stream]
    assert first[-1].timings["gpt_s"] > 0 and first[-1].timings["prosody_hit"] == 0.0  # the GPT ran, on one replica
    first_replica = stream.served.replica
    await stored(remote, {"prosody": before["prosody"] + 1, "audio": before["audio"] + 1})  # (one sentence)
    # another noise scale: the same prosody (tokens), another audio key, so only the GPT can be skipped
    for attempt in range(6):  # two at once go to both replicas (Serve picks the less loaded), mostly at once
        scales = [0.3 + 0.01 * (2 * attempt + k) for k in range(2)]
        streams = [remote.stream(text, alice.id, dataclasses.replace(PARAMS, noise_scale=n)) for n in scales]
        results = await asyncio.gather(*(collect(s) for s in streams))
        others = [(n, s, r) for n, s, r in zip(scales, streams, results) if s.served.replica != first_replica]
        if others:
            break
    else:
        pytest.fail("6 pairs of requests never reached the second replica")
    for n, stream, chunks in others:
        final = chunks[-1].timings  # (the sentence's; an early chunk's says "partial")
        assert final["prosody_hit"] == 1.0 and final["gpt_s"] == 0.0 and final["audio_hit"] == 0.0
        solo, _ = await local.synthesize(text, alice.id, dataclasses.replace(PARAMS, noise_scale=n))
        assert np.array_equal(np.concatenate([c.audio for c in chunks]), solo)


async def test_phrases_precomputed_on_a_replica_are_prosody_hits_for_every_replica(remote, local, alice):
    phrases = ["Precomputed once here.", "And a second phrase."]  # a sentence each
    before = entries(remote)
    done = await remote.voicing.precompute(alice, phrases, params=PARAMS)
    assert done == len(phrases)
    await stored(remote, {"prosody": before["prosody"] + done, "audio": before["audio"]})  # prosody only
    for phrase in phrases:
        chunks = await collect(remote.stream(phrase, alice.id, PARAMS))
        assert chunks[-1].timings["prosody_hit"] == 1.0 and chunks[-1].timings["gpt_s"] == 0.0
        assert same([c.audio for c in chunks], (await run(local, phrase, alice.id))[0])
    # a precompute in flight stops when it is told to (as a voice's delete does first), on the replica too
    task = remote.voicing.precompute(alice, [f"Long list {i}." for i in range(40)], params=PARAMS)
    await asyncio.sleep(0.2)
    await remote.voicing.stop_precompute(alice.id)
    assert task.cancelled()


def test_a_storage_call_costs_about_a_millisecond(config, remote):
    """The replicas' round trip to the storage actor, measured from this process (on its node, as a replica on
    another node of this machine): a cache lookup, made on a replica's event loop once per sentence."""
    import statistics

    from synthesis.cluster import storage as served

    (_, cache), link = served.connect(served.actor_name(config.ray.app_name))

    async def look_up() -> None:
        for i in range(300):
            await cache.get_tokens(f"{i:064x}")

    asyncio.run(look_up())
    calls = sorted(link.call_s)
    median, p95 = statistics.median(calls), calls[int(len(calls) * 0.95)]
    print(f"storage call (cache lookup, a miss): median {median * 1e3:.2f} ms, 95th percentile {p95 * 1e3:.2f} ms "
          f"over {len(calls)} calls")
    # ~1 ms here: the verdict is that no call waits for the actor's own timeout (10 s), with room for a loaded
    # machine; what a call costs is the benchmark's to say
    assert median < served.CALL_TIMEOUT_S / 20


async def test_full_replicas_answer_busy_at_once_and_a_cancelled_request_frees_its_slot(remote, alice):
    holders = []
    for i in range(4):  # every slot of both replicas
        stream = remote.stream(f"Holder {i}. " + LONG, alice.id, PARAMS)
        await anext(stream)
        holders.append(stream)
    waiting, firsts = [], []
    for i in range(4):  # Serve's queue of 4
        waiting.append(remote.stream(f"Waiter {i}.", alice.id, PARAMS))
        firsts.append(asyncio.ensure_future(anext(waiting[-1])))
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)
    assert not any(f.done() for f in firsts)

    with pytest.raises(BusyError):  # slots and queue full: refused at once, no waiting
        await anext(remote.stream("One too many.", alice.id, PARAMS))
    # refused while the queue was still full, not after it waited for a slot: no waiting request had one yet (a
    # bound in seconds here fails on a loaded machine)
    assert not any(f.done() for f in firsts)
    assert remote.busy

    freed_at = time.perf_counter()
    await holders[0].aclose()  # the caller goes away: its replica's work stops, its slot goes to a waiting one
    done, _ = await asyncio.wait(firsts, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    waited = time.perf_counter() - freed_at
    assert len(done) == 1
    (lucky,) = [w for w, f in zip(waiting, firsts) if f in done]
    assert lucky.served.replica == holders[0].served.replica
    for w, f in zip(waiting, firsts):  # the rest go away while queued: nothing of theirs is left anywhere
        if w is not lucky:
            f.cancel()
            await asyncio.gather(f, return_exceptions=True)
            await w.aclose()

    assert waited < 20  # a slot freed by the cancel: the holders' own ends are a minute or more away
    states = {st["replica"]: st for st in remote.replicas()}
    assert all(states[h.served.replica]["inflight"] >= 1 for h in holders[1:])  # ...and they still speak
    async for _ in lucky:
        pass
    for stream in holders[1:]:
        await stream.aclose()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # every replica reports itself idle: no work left behind
        states = remote.replicas()
        if len(states) == 2 and all(s["inflight"] == 0 and s["queue_depth"] == 0 and s["healthy"] for s in states):
            break
        await asyncio.sleep(0.5)
    else:
        pytest.fail(f"replicas did not go idle: {remote.replicas()}")
    assert not remote.busy and remote.metrics()["inflight"] == 0


async def test_the_benchmark_measures_at_tiny_size(remote, local, alice):
    from tests.cluster import bench

    o = await bench.overhead(local, remote, alice.id, 2)
    assert o["local_first_chunk_s"] > 0 and o["remote_first_chunk_s"] > 0
    assert o["first_chunk_overhead_s"] == o["remote_first_chunk_s"] - o["local_first_chunk_s"]
    t = await bench.throughput(remote, alice.id, 4, 2)
    assert t["requests"] == 4 and t["speech_per_s"] > 0 and 0 < t["ttfa_median_s"] <= t["ttfa_p95_s"] <= t["wall_s"]


async def test_the_http_api_speaks_through_the_replicas_unchanged(config, remote, local, alice):
    import aiohttp

    from bot.http import start_server
    from bot.services import Services, default_params
    from synthesis.types import to_pcm16

    cfg = dataclasses.replace(config, http=dataclasses.replace(
        config.http, token_env="VOICEBOT_TEST_CLUSTER_NO_TOKEN", rate_limit_per_min=0))
    runner = await start_server(Services(cfg, remote), "127.0.0.1", 0)
    text = "The weather is nice today. We should go for a walk."
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with aiohttp.ClientSession() as session:
            query = {"text": text, "text_lang": "en", "ref_audio_path": "alice", "seed": "1234", "media_type": "raw"}
            async with session.get(url + "/tts", params=query) as r:
                assert r.status == 200, await r.text()
                body = await r.read()
            async with session.get(url + "/healthz") as r:
                health = await r.json()
            # a replica counts while its last state report is fresh (STALE_S); on a loaded machine one report can
            # come late, so the scrape is repeated until both count, or a minute has passed
            deadline = time.monotonic() + 60
            while True:
                async with session.get(url + "/metrics") as r:
                    metrics = await r.text()
                if "voicebot_synthesis_replicas 2.0" in metrics or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
    finally:
        await runner.cleanup()
    audio, _ = await local.synthesize(text, alice.id, dataclasses.replace(default_params(cfg), language="en",
                                                                          seed=1234))
    assert np.array_equal(np.frombuffer(body, "<i2"), to_pcm16(audio))
    assert (health["status"], health["engine"], health["device"]) == ("ok", "torch", "cpu")
    assert "voicebot_synthesis_replicas 2.0" in metrics, remote.replicas()


async def test_streamed_text_is_spoken_sentence_by_sentence_in_order(remote, local, alice):
    sentences = ["The first sentence is here.", "Then comes the second one!", "Is this the third?", "And the last."]
    text = " ".join(sentences)

    async def pieces():  # a chat model's pieces, ending mid-word
        for i in range(0, len(text), 6):
            yield text[i:i + 6]

    chunks = [c async for c in remote.stream(pieces(), alice.id, PARAMS)]
    assert [c.index for c in chunks] == sorted(c.index for c in chunks)
    assert [s for i, s in enumerate(sentences) if any(c.index == i for c in chunks)] == sentences
    for i, sentence in enumerate(sentences):  # each sentence one request: as a local request of that sentence
        audio = np.concatenate([c.audio for c in chunks if c.index == i])
        solo, _ = await local.synthesize(sentence, alice.id, PARAMS)
        assert np.array_equal(audio, solo)


async def test_a_client_attaches_from_inside_a_running_event_loop(config, remote, alice):
    """`serve` builds its synthesizer inside its event loop, where Serve refuses blocking calls."""
    again = build_synthesizer(config)  # the application runs: this attaches to it
    try:
        audio, served = await run(again, "Attached from a loop.", alice.id)
        assert served is not None and len(audio) >= 1
    finally:
        await again.close()


async def test_the_storage_gone_fails_a_request_in_one_line_and_a_new_one_is_found(config, remote, alice):
    import functools

    import ray

    from bot.services import open_stores
    from synthesis.cluster import storage as served

    name = served.actor_name(config.ray.app_name)
    ray.kill(ray.get_actor(name, namespace=served.NAMESPACE), no_restart=True)  # as when the client's machine is down
    started = time.perf_counter()
    with pytest.raises(EngineError, match="cannot reach the voice and cache storage") as failed:
        await run(remote, "Is anybody there?", alice.id)
    assert "\n" not in str(failed.value) and time.perf_counter() - started < served.CALL_TIMEOUT_S
    # the client's machine back: a client starts a new storage actor, and the replicas find it under the name
    await asyncio.to_thread(served.start_storage, functools.partial(open_stores, config), config.ray.app_name,
                            config.cache.dir / "replicas")
    audio, _ = await run(remote, "Is anybody there?", alice.id)
    assert len(audio) >= 1


async def test_a_killed_replica_fails_only_its_request_and_the_next_one_succeeds(remote, local, alice):
    import os
    import signal

    doomed = remote.stream("Doomed. " + LONG, alice.id, PARAMS)  # still speaking when killed
    await anext(doomed)
    survivor_text = "The survivor speaks. It has two sentences."
    survivor = asyncio.ensure_future(run(remote, survivor_text, alice.id))  # the least loaded replica: the other
    await asyncio.sleep(0.2)
    os.kill(doomed.served.pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="stopped while serving this request"):
        async for _ in doomed:
            pass
    audio, served = await survivor
    assert served.replica != doomed.served.replica
    solo = (await run(local, survivor_text, alice.id))[0]
    assert same(audio, solo)
    after, served = await run(remote, survivor_text, alice.id)  # the next request goes to a live replica
    assert served.pid != doomed.served.pid and same(after, solo)
    assert remote.metrics()["replica_failures"] >= 1

