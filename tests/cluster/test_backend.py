"""The backend switch without a cluster: a missing Ray is one clear line, and the local path is untouched."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from bot.config import ConfigError, config_from_dict
from bot.services import build_synthesizer
from synthesis import SpeechError, Synthesizer
from synthesis.cluster.options import ClusterOptions


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


def test_autoscaling_keys_reach_serves_autoscaler_and_bad_values_are_one_line():
    from synthesis.cluster.client import _autoscaling

    cfg = config_from_dict({"ray": {"autoscaling": True, "min_replicas": 1, "max_replicas": 4, "target_queue": 3,
                                    "upscale_delay_s": 2, "downscale_delay_s": 45, "scale_window_s": 10,
                                    "drain_timeout_s": 90}})
    assert cfg.ray.options.drain_timeout_s == 90.0
    assert _autoscaling(cfg.ray.options) == {
        "min_replicas": 1, "max_replicas": 4, "initial_replicas": 1, "target_ongoing_requests": 3.0,
        "upscale_delay_s": 2.0, "downscale_delay_s": 45.0, "look_back_period_s": 10.0, "metrics_interval_s": 2.5}
    assert _autoscaling(config_from_dict({}).ray.options)["metrics_interval_s"] == 7.5  # a 30 s window
    for key, value, message in [
        ("upscale_delay_s", -1, "ray.upscale_delay_s must be a finite number >= 0, got -1.0"),
        ("downscale_delay_s", float("nan"), "ray.downscale_delay_s must be a finite number >= 0, got nan"),
        ("scale_window_s", 0, "ray.scale_window_s must be a finite number above 0, got 0.0"),
        ("drain_timeout_s", "long", "config key ray.drain_timeout_s: expected a number, got 'long'"),
    ]:
        with pytest.raises(ConfigError) as e:
            config_from_dict({"ray": {key: value}})
        assert str(e.value) == message


@pytest.mark.filterwarnings("ignore:coroutine 'SynthesisReplica.__del__' was never awaited")  # Python's own, at GC
async def test_a_replica_whose_start_failed_shuts_down_without_a_second_error():
    from synthesis.cluster.replica import SynthesisReplica

    replica = SynthesisReplica.__new__(SynthesisReplica)  # as Serve holds it when __init__ raised (a model missing)
    await replica.__del__()  # Serve's graceful shutdown of it: nothing was made, nothing to undo
