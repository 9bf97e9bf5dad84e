"""The diffusion-decoder families of GPT-SoVITS (v3, v4, v5dev, v5turbo): what each one fixes.

Every number here is upstream's (reference ``gptsovits-v3v4v5.md`` sections 2, 4-7): the mel front-end a voice's
prompt is made with, the frame rate of the encoder features, the prompt and chunk sizes of the sampler, the sampler's
defaults, and the vocoder's rate. Nothing about sizes of weights: those come from the files.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FamilySpec", "FAMILIES", "family_spec", "DIT_FAMILIES", "MAX_CFG"]


@dataclass(frozen=True)
class FamilySpec:
    """One family's fixed behaviour.

    Attributes
    ----------
    name:
        ``"v3"``, ``"v4"``, ``"v5dev"`` or ``"v5turbo"``.
    mel_rate, mel_fft, mel_hop:
        the reference mel front-end: sample rate (Hz), FFT/window size and hop (samples); 100 mel bins.
    feature_scale:
        the nearest up-sampling of the 50 Hz encoder output to the mel frame rate (2 = 100 fps, 1.875 = 93.75 fps).
    mask_scale:
        frames kept by the feature encoder's length mask per semantic token (4, or 3.875 for v3).
    prompt_frames:
        the most reference frames a sampler prompt keeps (upstream ``T_ref`` / ``V5_REFERENCE_FRAMES``).
    chunk_frames:
        prompt + target frames per sampler call (upstream ``T_chunk`` / ``V5_TOTAL_CHUNK_FRAMES``).
    max_target_frames:
        v5: the most target frames per call (640); 0: no such cap (v3/v4).
    rolling_tail:
        v5: frames of the previous chunk that replace the end of the reference prompt (32); 0: v3/v4, whose whole
        prompt is the previous chunk's end.
    default_steps, default_cfg:
        the sampler's defaults (upstream ``sampling_defaults`` / the API's ``sample_steps``).
    noise_scale:
        the standard deviation of the starting noise (v5: the constant 0.875).
    step_embedding:
        whether the DiT also embeds the step size ``1/steps`` (v3/v4: ``d_embed``).
    allowed_steps:
        the step counts accepted (v5 validates them; v3/v4 accept any positive count).
    vocoder_rate, vocoder_hop:
        output sample rate (Hz) and samples per mel frame.
    """

    name: str
    mel_rate: int
    mel_fft: int
    mel_hop: int
    feature_scale: float
    mask_scale: float
    prompt_frames: int
    chunk_frames: int
    max_target_frames: int
    rolling_tail: int
    default_steps: int
    default_cfg: float
    noise_scale: float
    step_embedding: bool
    allowed_steps: tuple[int, ...]
    vocoder_rate: int
    vocoder_hop: int

    @property
    def is_v5(self) -> bool:
        """v5dev/v5turbo: the ``CFMV5`` sampler and chunking (CFG keeps the text, a rolling 32-frame tail)."""
        return self.rolling_tail > 0

    @property
    def mel_frame_rate(self) -> float:
        """Mel (and feature) frames per second."""
        return self.mel_rate / self.mel_hop


V5_STEPS = (4, 8, 16, 32)  # upstream validate_v5_sampling
MAX_CFG = 2.0  # the guidance rate bound v5 validates (v3/v4 take none)


def _at_48k(name: str, steps: int, cfg: float, v5: bool) -> FamilySpec:
    """v4 and v5: the 32 kHz mel (n_fft 1280, hop 320), 100 fps features, the 48 kHz HiFi-GAN."""
    return FamilySpec(
        name=name, mel_rate=32000, mel_fft=1280, mel_hop=320, feature_scale=2.0, mask_scale=4.0,
        prompt_frames=500, chunk_frames=1000, max_target_frames=640 if v5 else 0, rolling_tail=32 if v5 else 0,
        default_steps=steps, default_cfg=cfg, noise_scale=0.875 if v5 else 1.0, step_embedding=not v5,
        allowed_steps=V5_STEPS if v5 else (), vocoder_rate=48000, vocoder_hop=480,
    )


FAMILIES: dict[str, FamilySpec] = {
    "v3": FamilySpec(name="v3", mel_rate=24000, mel_fft=1024, mel_hop=256, feature_scale=1.875, mask_scale=3.875,
                     prompt_frames=468, chunk_frames=934, max_target_frames=0, rolling_tail=0, default_steps=32,
                     default_cfg=0.0, noise_scale=1.0, step_embedding=True, allowed_steps=(),
                     vocoder_rate=24000, vocoder_hop=256),
    "v4": _at_48k("v4", 32, 0.0, v5=False),
    "v5dev": _at_48k("v5dev", 32, 1.3, v5=True),
    "v5turbo": _at_48k("v5turbo", 4, 0.0, v5=True),
}
DIT_FAMILIES = tuple(FAMILIES)  # the families whose SoVITS decodes through a DiT and a vocoder


def family_spec(name: str) -> FamilySpec:
    """The spec of ``name`` (``"v5"`` is upstream's alias of ``"v5dev"``); ValueError names the known ones."""
    spec = FAMILIES.get("v5dev" if name == "v5" else name)
    if spec is None:
        raise ValueError(f"unknown model family {name!r}; use one of {', '.join(FAMILIES)}")
    return spec
