"""One real local Ray cluster (a head and 2 worker nodes of 1 CPU each) for every cluster test module.

Starting it costs half a minute or more (three `ray start` s), so the modules share it; each module deploys its own
Serve application on it (tests/cluster/apps.py) and removes it when done, which frees the workers' CPUs for the next.
"""

from __future__ import annotations

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
