"""The cluster's workers run at the bot's priority: Ray's default (nice 15) lets any busy process on a node starve a
replica, which then speaks late (and a suite run beside busy processes crawls through its cluster tests)."""

from __future__ import annotations

import os

import pytest

from tests.cluster.local import LocalCluster

pytest.importorskip("ray", reason="ray is not installed: pip install 'voicebot[cluster]'")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_workers_run_at_normal_priority(cluster: LocalCluster) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote(), timeout=300) == 0
