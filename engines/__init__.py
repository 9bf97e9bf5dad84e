"""Inference engines for GPT-SoVITS v2: the only package where tensors live."""

from engines.base import Engine, EngineError, SamplingParams, SemanticRequest, SpeechError, VoicePrompt
from engines.loader import load_engine

__all__ = ["Engine", "EngineError", "SamplingParams", "SemanticRequest", "SpeechError", "VoicePrompt", "load_engine"]
