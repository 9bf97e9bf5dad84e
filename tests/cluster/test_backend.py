"""The backend switch without a cluster: a missing Ray is one clear line, and the local path is untouched."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from bot.config import config_from_dict
from bot.services import build_synthesizer
from synthesis import ClusterOptions, SpeechError, Synthesizer


def test_ray_backend_without_ray_installed_says_how_to_install_it(tiny_config, monkeypatch):
    cfg = dataclasses.replace(tiny_config, synthesis=dataclasses.replace(tiny_config.synthesis, backend="ray"))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed: `import ray` raises ImportError
    with pytest.raises(SpeechError) as e:
        build_synthesizer(cfg)
    assert "pip install 'voicebot[cluster]'" in str(e.value) and "\n" not in str(e.value)


async def test_local_backend_is_the_default_and_builds_a_local_synthesizer(tiny_config):
    assert config_from_dict({}).synthesis.backend == "local"
    synth = build_synthesizer(tiny_config)
    try:
        assert isinstance(synth, Synthesizer)
    finally:
        await synth.close()


def test_ray_options_reach_the_cluster_options():
    cfg = config_from_dict({"synthesis": {"backend": "ray"},
                            "ray": {"address": "10.0.0.5:6379", "autoscaling": True, "min_replicas": 2,
                                    "max_replicas": 5, "gpus_per_replica": 1}})
    options = cfg.ray.options
    assert options == ClusterOptions(address="10.0.0.5:6379", autoscaling=True, min_replicas=2, max_replicas=5,
                                     gpus_per_replica=1.0)
    assert options.capacity_replicas == 5
    assert config_from_dict({}).ray.options == ClusterOptions()
