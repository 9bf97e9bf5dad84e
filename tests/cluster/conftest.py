"""One real local Ray cluster (a head and 2 worker nodes of 1 CPU each) for every cluster test module, and each
module's client and local reference.

Starting it costs half a minute or more (three `ray start` s), so the modules share it; each module deploys its own
Serve application on it (tests/cluster/apps.py) and removes it when done, which frees the workers' CPUs for the next.
A module sets its application with a ``config`` fixture (and, to give the replicas another view, ``replica_config``).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.cluster.local import LocalCluster


@pytest.fixture(scope="package")
def cluster():
    c = LocalCluster(workers=2, cpus=1)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def replica_config(config):
    """The config the replicas build from: the client's, unless a module says otherwise."""
    return config


@pytest.fixture(scope="module")
def remote(config, replica_config):
    """The client of the module's application (deployed by it, removed after the module)."""
    from bot.services import connect_replicas
    from tests.cluster.apps import close_remote

    synth = connect_replicas(config, replica_config)
    yield synth
    close_remote(synth, config.ray.app_name)


@pytest.fixture(scope="module")
def local(config):
    """The same models and voices in this process, with caches of its own: the reference for every output."""
    from tests.cluster.apps import local_twin

    synth = local_twin(config)
    yield synth
    asyncio.run(synth.close())
