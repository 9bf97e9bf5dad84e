"""Speaker turns: where one voice stops and another starts in an upload, so the reference is one person.

A stored voice is the reference clip's timbre; a stretch with 5 s of one person and 4 s of another makes a voice
that is neither. No speaker model is needed to see most changes. The classic BIC test (Chen & Gopalakrishnan 1998)
models a stretch of cepstral frames as one Gaussian, or as two split at a candidate point, and keeps the split when
the likelihood it gains is worth the second Gaussian's parameters. Two people differ in vocal tract (formants,
hence the spectral envelope the MFCCs describe), so their frames fit two Gaussians far better than one; one
person's words change the phones but not the voice, and stay under the penalty. Candidates come from a scan with
fixed windows and from binary segmentation, then each is tested on the whole turns beside it and the weakest
dropped while it fails (as DISTBIC, Delacourt & Wellekens 2000, does). Pitch is the second cue: a test on
thousands of frames finds any small difference "significant", so pitch is not one more Gaussian dimension but an
effect size, the shift of the median fundamental between two turns; a shift of several semitones (a man and a
woman) lowers the bar the spectral test must pass. Only voiced frames count (pauses, breaths and noise are no
one's voice), c0 is left out so a speaker's loudness is no change of speaker, and a full-covariance
log-determinant is unchanged by a fixed linear filter (a microphone's colour cancels out). Numpy on prefix sums
and batched FFTs: a 60 s clip takes a few hundred milliseconds on one busy core.
"""

from __future__ import annotations

import numpy as np
import soxr

__all__ = ["speaker_turns", "mfcc"]

HOP_S = 0.01  # s between feature frames
WIN_S = 0.025  # s, analysis window of one feature frame
N_MELS = 24  # mel filters between MEL_LOW and MEL_HIGH
N_CEPS = 12  # cepstral coefficients kept: c1..c12 (c0, the frame's loudness, is left out)
MEL_LOW = 100.0  # Hz, below the lowest voice fundamental's useful harmonics
MEL_HIGH = 7600.0  # Hz, under the 8 kHz band edge of a 16 kHz phone or voice-message recording
MIN_TURN_S = 1.5  # s of voiced speech: a shorter turn is not told apart (too few frames for a covariance)
# BIC penalty weight (lambda): a change is kept when its likelihood gain exceeds PENALTY times the classic BIC
# penalty. Measured (tests/tools/measure_speakers.py --long): one espeak-ng voice, 9-71 s, best split 0.97-1.83 (2.13
# for speaker_a slowed 10 %); one voice against itself with formants moved 5-12 %, 5.3-8.1; the committed two voices,
# 2.2-2.9 (their spectra are close: espeak-ng's variants share one formant synthesiser).
PENALTY = 2.4
CANDIDATE_RATIO = 1.0  # BIC ratio above which a split is a candidate for the final test against PENALTY
SCAN_WINDOW_S = 2.0  # s of voiced speech each side of a candidate in the scan
SCAN_STEP_S = 0.05  # s of voiced speech between scanned candidates
PITCH_RATE = 8000  # Hz, pitch is looked for at this rate (a voice's fundamental is far below 4 kHz)
PITCH_WIN_S = 0.04  # s, pitch analysis window (over two periods at PITCH_MIN_HZ)
PITCH_MIN_HZ = 60.0  # Hz, lowest fundamental looked for
PITCH_MAX_HZ = 400.0  # Hz, highest
PERIODIC = 0.5  # normalised autocorrelation at the period for a frame to have a pitch
# Semitones between the median pitch of two turns above which a change needs only CANDIDATE_RATIO, not PENALTY.
# Measured: one espeak-ng voice, any split of 9-71 s, at most 3.3; the committed two voices (a man's and a woman's
# espeak-ng variants), 5.2-6.5. Between a man and a woman it is typically 7-12.
PITCH_SHIFT_ST = 5.0
MIN_PITCHED_S = 0.5  # s of periodic frames each side for the pitch comparison to count
REFINE_S = 0.5  # s of voiced speech around a change within which its place is refined
SNAP_S = 0.3  # s of voiced speech around a change within which it moves to the longest pause
MIN_SNAP_PAUSE_S = 0.06  # s, a pause at least this long is where a change of speaker is placed


def mfcc(x: np.ndarray, sr: int) -> np.ndarray:
    """Mel-cepstral coefficients c1..c12 of each 25 ms frame every 10 ms.

    Parameters
    ----------
    x: ``[N]`` float32 mono.
    sr: Hz (at least 16 kHz gives the full :data:`MEL_HIGH` band; lower rates use what is there).

    Returns
    -------
    ``[T, N_CEPS]`` float64, frame ``t`` covering samples ``[t * hop, t * hop + win)``, ``T = 1 + (N - win) // hop``
    (0 when the clip is shorter than one window).
    """
    hop = int(round(HOP_S * sr))
    win = int(round(WIN_S * sr))
    if x.size < win:
        return np.zeros((0, N_CEPS))
    n_fft = 1 << (win - 1).bit_length()
    n_frames = 1 + (x.size - win) // hop
    frames = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64, copy=False), win)[::hop][:n_frames]
    frames = frames - frames.mean(axis=1, keepdims=True)  # [T, win]
    frames = frames - 0.97 * np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # pre-emphasis
    power = np.abs(np.fft.rfft(frames * np.hamming(win), n_fft, axis=1)) ** 2  # [T, n_fft/2+1]
    logmel = np.log(power @ _mel_filters(sr, n_fft).T + 1e-10)  # [T, N_MELS]
    return logmel @ _dct_matrix()  # [T, N_CEPS]


def _mel_filters(sr: int, n_fft: int) -> np.ndarray:
    """``[N_MELS, n_fft/2+1]`` triangular filters evenly spaced on the mel scale (HTK: 2595 log10(1 + f/700))."""
    high = min(MEL_HIGH, sr / 2)

    def to_mel(f: np.ndarray | float) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    edges_hz = 700.0 * (10.0 ** (np.linspace(to_mel(MEL_LOW), to_mel(high), N_MELS + 2) / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(n_fft, 1.0 / sr)  # [n_fft/2+1] Hz
    lo, mid, hi = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    return np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))


def _dct_matrix() -> np.ndarray:
    """``[N_MELS, N_CEPS]`` orthonormal DCT-II basis for coefficients 1..N_CEPS."""
    m = np.arange(N_MELS)[:, None] + 0.5
    k = np.arange(1, N_CEPS + 1)[None, :]
    return np.sqrt(2.0 / N_MELS) * np.cos(np.pi * k * m / N_MELS)


def pitch(x: np.ndarray, sr: int, frames: np.ndarray) -> np.ndarray:
    """Log fundamental frequency of the given feature frames of :func:`mfcc`, NaN where a frame is not periodic.

    Normalised autocorrelation of a :data:`PITCH_WIN_S` window centred on the frame (two periods of the lowest
    voice), corrected for the window's own taper, at :data:`PITCH_RATE`; the frame is periodic when its highest
    peak between :data:`PITCH_MIN_HZ` and :data:`PITCH_MAX_HZ` reaches :data:`PERIODIC`.

    Parameters
    ----------
    x: ``[N]`` float32 mono @ ``sr``.
    frames: ``[K]`` int, indices of :func:`mfcc` frames (those of the voiced speech).

    Returns
    -------
    ``[K]`` float64, ``log(Hz)`` or NaN.
    """
    y = np.asarray(soxr.resample(x, sr, PITCH_RATE), np.float32) if sr != PITCH_RATE else x.astype(np.float32)
    win = int(round(PITCH_WIN_S * PITCH_RATE))
    starts = np.round((frames * HOP_S + WIN_S / 2) * PITCH_RATE).astype(np.int64) - win // 2  # centred windows
    padded = np.concatenate([np.zeros(win, np.float32), y, np.zeros(win, np.float32)])
    seg = padded[(starts + win)[:, None] + np.arange(win)[None, :]]  # [K, win]
    seg = seg - seg.mean(axis=1, keepdims=True)
    taper = np.hanning(win).astype(np.float32)
    lo, hi = int(PITCH_RATE / PITCH_MAX_HZ), int(PITCH_RATE / PITCH_MIN_HZ) + 1
    n_fft = 1 << (2 * win - 1).bit_length()
    ac = np.fft.irfft(np.abs(np.fft.rfft(seg * taper, n_fft, axis=1)) ** 2, n_fft, axis=1)[:, :hi]
    own = np.fft.irfft(np.abs(np.fft.rfft(taper, n_fft)) ** 2, n_fft)[:hi]  # the taper's autocorrelation, > 0 here
    ac = (ac / own) / np.maximum(ac[:, :1] / own[0], 1e-12)  # 1 at lag 0, near 1 at the period of a steady voice
    lag = lo + np.argmax(ac[:, lo:hi], axis=1)
    periodic = ac[np.arange(ac.shape[0]), lag] >= PERIODIC
    return np.where(periodic, np.log(PITCH_RATE / lag), np.nan)


class _Moments:
    """Prefix sums of frames and their outer products: any stretch's covariance in O(d^2)."""

    def __init__(self, z: np.ndarray) -> None:
        d = z.shape[1]
        self.s1 = np.concatenate([np.zeros((1, d)), np.cumsum(z, axis=0)])  # [n+1, d]
        outer = z[:, :, None] * z[:, None, :]  # [n, d, d]
        self.s2 = np.concatenate([np.zeros((1, d, d)), np.cumsum(outer, axis=0)])  # [n+1, d, d]

    def logdet(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``log |cov(z[a:b])|`` for each pair of bounds (maximum-likelihood covariance)."""
        m = (b - a).astype(np.float64)[:, None]
        mean = (self.s1[b] - self.s1[a]) / m  # [K, d]
        cov = (self.s2[b] - self.s2[a]) / m[:, :, None] - mean[:, :, None] * mean[:, None, :]
        cov += 1e-6 * np.eye(cov.shape[1])  # a clip of pure digital silence must not give log 0
        return np.linalg.slogdet(cov)[1]

    def bic_ratio(self, a: np.ndarray, c: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Likelihood gain of modelling ``z[a:b]`` as two Gaussians split at ``c``, over the BIC penalty of the
        second Gaussian's parameters. The classic test keeps the split when this exceeds 1; see :data:`PENALTY`."""
        d = self.s1.shape[1]
        n, n1, n2 = (b - a).astype(np.float64), (c - a).astype(np.float64), (b - c).astype(np.float64)
        gain = 0.5 * (n * self.logdet(a, b) - n1 * self.logdet(a, c) - n2 * self.logdet(c, b))
        params = d + d * (d + 1) / 2  # one more mean and full covariance
        return gain / (0.5 * params * np.log(n))


def _changes(z: np.ndarray, logf0: np.ndarray | None = None) -> list[int]:
    """Indices ``c`` into ``z`` (``[n, d]`` voiced frames) where a new speaker starts at frame ``c``; sorted.

    ``logf0``: ``[n]`` the frames' :func:`pitch` (NaN where none); where two turns' medians differ by
    :data:`PITCH_SHIFT_ST` or more, the change between them needs a BIC ratio above :data:`CANDIDATE_RATIO` only.

    Candidates come from two searches that each miss what the other finds: a scan with :data:`SCAN_WINDOW_S` of
    speech on each side (places a change well, and sees a short turn in a long clip) and binary segmentation (the
    best split of the whole, then of each side: sees a change where the windows are too short to). Then every
    candidate is tested against the whole turns beside it and the weakest dropped while it is under its bar
    (:data:`PENALTY`, or less with a pitch shift); what remains are the changes, each moved to its best place
    within :data:`REFINE_S`.
    """
    n = z.shape[0]
    min_turn = int(round(MIN_TURN_S / HOP_S))
    if n < 2 * min_turn:
        return []
    mom = _Moments(z)
    candidates = np.array(sorted(set(_scan_peaks(mom, n, min_turn)) | set(_binary_splits(mom, n, min_turn))))
    changes: list[int] = []
    for c in candidates:  # candidates closer than a turn: keep the first
        if not changes or c - changes[-1] >= min_turn:
            changes.append(int(c))
    while changes:
        bounds = np.array([0, *changes, n])
        ratio = mom.bic_ratio(bounds[:-2], bounds[1:-1], bounds[2:])
        if logf0 is not None:
            shift = np.array([_pitch_shift(logf0, a, c, b) for a, c, b in zip(bounds[:-2], bounds[1:-1], bounds[2:])])
            ratio -= np.where(shift >= PITCH_SHIFT_ST, CANDIDATE_RATIO, PENALTY)
        else:
            ratio -= PENALTY
        worst = int(np.argmin(ratio))
        if ratio[worst] > 0:
            break
        changes.pop(worst)
    # Each change to the best place near it, judged on the whole turns beside it (a scan candidate is only as
    # fine as its step, and was found with the short windows).
    reach = int(round(REFINE_S / HOP_S))
    for i, c in enumerate(changes):
        a = changes[i - 1] if i > 0 else 0
        b = changes[i + 1] if i + 1 < len(changes) else n
        near = np.arange(max(a + min_turn, c - reach), min(b - min_turn, c + reach) + 1)
        if near.size:
            changes[i] = int(near[int(np.argmax(mom.bic_ratio(np.full(near.size, a), near, np.full(near.size, b))))])
    return changes


def _pitch_shift(logf0: np.ndarray, a: int, c: int, b: int) -> float:
    """Semitones between the median pitch of frames ``[a, c)`` and ``[c, b)`` (0 when either has too few)."""
    least = int(round(MIN_PITCHED_S / HOP_S))
    left, right = logf0[a:c], logf0[c:b]
    left, right = left[~np.isnan(left)], right[~np.isnan(right)]
    if left.size < least or right.size < least:
        return 0.0
    return abs(float(np.median(left) - np.median(right))) * 12.0 / np.log(2.0)


def _scan_peaks(mom: _Moments, n: int, min_turn: int) -> list[int]:
    """Peaks of the BIC ratio between fixed windows either side, one per ``min_turn``, above :data:`CANDIDATE_RATIO`."""
    w = max(min_turn, min(int(round(SCAN_WINDOW_S / HOP_S)), n // 2))
    if n < 2 * w:
        return []
    c = np.arange(w, n - w + 1, max(1, int(round(SCAN_STEP_S / HOP_S))))
    ratio = mom.bic_ratio(c - w, c, c + w)
    peaks: list[int] = []
    for i in np.argsort(-ratio):
        if ratio[i] <= CANDIDATE_RATIO:
            break
        if all(abs(int(c[i]) - p) >= min_turn for p in peaks):
            peaks.append(int(c[i]))
    return peaks


def _binary_splits(mom: _Moments, n: int, min_turn: int) -> list[int]:
    """Best split of ``[0, n)``, then of each side, while the best has a BIC ratio above :data:`CANDIDATE_RATIO`."""
    out: list[int] = []
    todo = [(0, n)]
    while todo:
        a, b = todo.pop()
        if b - a < 2 * min_turn:
            continue
        c = np.arange(a + min_turn, b - min_turn + 1)
        ratio = mom.bic_ratio(np.full(c.size, a), c, np.full(c.size, b))
        i = int(np.argmax(ratio))
        if ratio[i] > CANDIDATE_RATIO:
            out.append(int(c[i]))
            todo += [(a, int(c[i])), (int(c[i]), b)]
    return out


def speaker_turns(x: np.ndarray, sr: int, voiced: np.ndarray, frame_s: float) -> list[tuple[int, int]]:
    """Split a clip into stretches of one speaker each.

    Parameters
    ----------
    x: ``[N]`` float32 mono @ ``sr``.
    voiced: ``[F]`` bool, frames of ``frame_s`` seconds where someone speaks (only these frames are compared).
    frame_s: seconds per frame of ``voiced``.

    Returns
    -------
    ``[(start, end), ...]`` frame ranges of ``voiced`` that cover ``[0, F)`` in order, one per speaker turn; a
    single ``(0, F)`` when one voice is heard throughout (or too little speech to tell). A boundary lies in the
    middle of the longest pause within :data:`SNAP_S` of speech of the detected change, or at the new speaker's
    first voiced frame when there is none.
    """
    n_frames = voiced.size
    feats = mfcc(x, sr)  # [T, N_CEPS]
    if feats.shape[0] == 0 or not voiced.any():
        return [(0, n_frames)]
    centres = np.arange(feats.shape[0]) * HOP_S + WIN_S / 2  # s
    keep = np.flatnonzero(voiced[np.minimum((centres / frame_s).astype(np.int64), n_frames - 1)])  # [n]
    changes = _changes(feats[keep], pitch(x, sr, keep))
    bounds = [0]
    snap = int(round(SNAP_S / HOP_S))
    min_pause = int(round(MIN_SNAP_PAUSE_S / HOP_S))
    for c in changes:
        # Speakers take turns in pauses: the change moves into the longest pause within SNAP_S of speech of it.
        lo, hi = max(1, c - snap), min(keep.size - 1, c + snap)
        pause = keep[lo : hi + 1] - keep[lo - 1 : hi] - 1  # [hi - lo + 1] feature frames of pause before keep[j]
        j = lo + int(np.argmax(pause))
        if pause[j - lo] >= min_pause:
            t = 0.5 * (centres[keep[j - 1]] + centres[keep[j]])  # the middle of that pause
        else:
            t = centres[keep[c]]  # no pause near: the new speaker's first voiced frame
        bounds.append(min(n_frames - 1, max(bounds[-1] + 1, int(t / frame_s))))
    bounds.append(n_frames)
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
