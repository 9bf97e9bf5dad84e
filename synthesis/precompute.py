"""Phrase precompute: the GPT's tokens for a voice's common phrases, computed ahead so they hit the prosody cache."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from synthesis.scheduler import BACKGROUND
from synthesis.stages import SentenceJob, Stages
from synthesis.text import split_sentences
from synthesis.types import SynthesisParams, Voice

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


async def precompute_phrases(stages: Stages, voice: Voice, phrases: Sequence[str], params: SynthesisParams,
                             progress: Progress | None = None) -> int:
    """Compute and cache the prosody of every sentence of ``phrases`` not cached yet; returns how many were computed.

    Runs at :data:`~synthesis.scheduler.BACKGROUND` priority, so live requests always go first. ``progress`` gets
    ``("precompute", fraction)`` after each phrase. ``voice`` must fit the loaded model (see ``Voicing.fit``).
    """
    done = 0
    if not stages.cacheable(params):  # nothing computed here could be served again
        log.info("precompute skipped: the cache keeps no random-seed samples (cache.reuse_random is off)")
        return done
    order = (stages.next_request(),)
    for i, phrase in enumerate(phrases):
        for index, sentence in enumerate(split_sentences(phrase, params.split_method, params.language)):
            job = SentenceJob(sentence, index, voice, params, priority=BACKGROUND, order=order)
            await stages.phonemize(job)
            if await stages.cache.get_tokens(job.prosody_key) is None:
                tokens, _ = await stages.semantic(job)
                await stages.cache.put_tokens(job.prosody_key, tokens, voice.id)  # (queued: a lookup sees it)
                done += 1
        if progress is not None:
            progress("precompute", (i + 1) / len(phrases))
    return done
