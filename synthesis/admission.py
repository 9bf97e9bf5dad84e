"""Admission: how many requests a synthesizer takes at once, and the stream that gives a request's place back.

One class for the local pipeline and the Ray client: a request is admitted at its ``stream()`` call and holds its
place until its stream ends, however it ends (exhausted, failed, closed, never iterated and dropped); past the
capacity it is refused with :class:`~synthesis.types.BusyError` at its first step, before any work.
"""

from __future__ import annotations

import collections
from typing import AsyncGenerator, Callable

from synthesis.types import AudioChunk, BusyError


class Admission:
    """The requests admitted now, against a capacity read at each call (a test or a reload may change it).

    Parameters
    ----------
    capacity: how many requests may be admitted at once.
    counters: where a refusal is counted (key ``busy``), the synthesizer's metrics counters.
    """

    def __init__(self, capacity: Callable[[], int], counters: collections.Counter[str]) -> None:
        self._capacity = capacity
        self._counters = counters
        self.in_flight = 0  # requests between their stream() call and the end of their stream

    @property
    def capacity(self) -> int:
        return self._capacity()

    @property
    def busy(self) -> bool:
        """True when a new request would be refused."""
        return self.in_flight >= self._capacity()

    def admit(self) -> Callable[[], None] | None:
        """Take a place: returns its release (giving it back once, however often it is called), or None when every
        place is taken (the refusal counted)."""
        if self.busy:
            self._counters["busy"] += 1
            return None
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1

        return release

    def stream(self, make: Callable[[Callable[[], None]], AsyncGenerator[AudioChunk, None]],
               refusal: Callable[[], str], *, admitted: bool = True) -> AdmittedStream:
        """Admit one request whose chunks ``make(release)`` builds (the body may give its place back early), or
        refuse it: a stream that raises ``BusyError(refusal())`` at its first step. ``admitted=False``: work that
        nobody waits for (a precompute), never refused and holding no place."""
        if not admitted:
            return AdmittedStream(make(_nothing), _nothing)
        release = self.admit()
        if release is None:
            return AdmittedStream(refused(BusyError(refusal())), _nothing)
        return AdmittedStream(make(release), release)


class AdmittedStream:
    """An admitted request's chunks; gives its place back once, however the stream ends.

    Ending covers exhaustion, an error, :meth:`aclose` (also of a stream that was never iterated, whose body never
    ran) and, as a last resort, garbage collection.
    """

    def __init__(self, chunks: AsyncGenerator[AudioChunk, None], release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release = release

    def __aiter__(self) -> AdmittedStream:
        return self

    async def __anext__(self) -> AudioChunk:
        try:
            return await anext(self._chunks)
        except BaseException:
            self._release()
            raise

    async def aclose(self) -> None:
        """Stop the request (its model work stops within one GPT step) and give its place back."""
        try:
            await self._chunks.aclose()
        finally:
            self._release()

    def __del__(self) -> None:
        self._release()


async def refused(error: BaseException) -> AsyncGenerator[AudioChunk, None]:
    """A stream that raises ``error`` at its first step (a request that was not admitted)."""
    raise error
    yield  # pragma: no cover - makes this an async generator


def _nothing() -> None:
    """The release of a request that was never admitted."""
