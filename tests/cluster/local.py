"""A real multi-node Ray cluster on this machine: a head and workers, each a separate `ray start` with its own CPUs.

Used by the cluster tests and the replica benchmark; ``make cluster`` runs the same commands from the Makefile. The
head gets no CPUs (only Serve's controller lives there), so every replica runs on a worker node, one per CPU.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node: chunks are small, Ray's default (30 % of RAM) is far too much
START_TIMEOUT_S = 600  # one `ray start` (a loaded 2-core machine has taken 25 s for the head)
JOIN_WAIT_S = 120  # a node whose `ray start` gave up (Ray waits 30 s for its raylet) may still join: this long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """``workers`` worker nodes of ``cpus`` CPUs each, under a head node at ``127.0.0.1:<port>``.

    The nodes' worker processes import this checkout (``PYTHONPATH``), as the replicas of a real deployment import
    the installed voicebot. :meth:`stop` runs ``ray stop``, which ends every Ray process of this machine.
    """

    def __init__(self, workers: int = 2, cpus: float = 1, port: int | None = None) -> None:
        self.workers = workers
        self.cpus = cpus
        self.port = port or free_port()
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                            os.environ.get("PYTHONPATH")])),
                    "RAY_USAGE_STATS_ENABLED": "0"}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ray(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(RAY), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start(self) -> LocalCluster:
        """Start the head, then the workers; a worker that did not come up is started once more."""
        store = f"--object-store-memory={OBJECT_STORE_BYTES}"
        _wait(self._ray("start", "--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false",
                        "--disable-usage-stats", store))
        for attempt in range(2):
            missing = self.workers + 1 - self.alive_nodes()
            # one after another: on a loaded machine, raylets started side by side miss Ray's 30 s start-up wait
            errors = [_wait(self._ray("start", f"--address={self.address}", f"--num-cpus={self.cpus:g}", store),
                            check=False) for _ in range(missing)]
            if self._joined(JOIN_WAIT_S if any(errors) else 10):
                return self
            if attempt:
                self.stop()
                raise RuntimeError(f"the local Ray cluster did not reach {self.workers} workers: "
                                   + " | ".join(e for e in errors if e))
        return self

    def alive_nodes(self) -> int:
        """Nodes the cluster reports active (`ray status`)."""
        out = subprocess.run([str(RAY), "status", f"--address={self.address}"], env=self.env, capture_output=True,
                             text=True, timeout=120).stdout
        active = out.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in out else ""
        return sum(int(n) for n in re.findall(r"^\s*(\d+) node_", active, re.M))

    def _joined(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            if self.alive_nodes() >= self.workers + 1:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(3)

    def stop(self) -> None:
        subprocess.run([str(RAY), "stop", "--force"], env=self.env, capture_output=True, timeout=120)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait(p: subprocess.Popen[bytes], *, check: bool = True) -> str:
    """Wait for a `ray start`; its failure in one line ("" when it succeeded), raised when ``check``."""
    out, _ = p.communicate(timeout=START_TIMEOUT_S)
    if p.returncode == 0:
        return ""
    tail = out.decode(errors="replace").strip().splitlines()[-2:]
    error = f"`{' '.join(map(str, p.args))}` failed ({p.returncode}): " + " | ".join(tail)  # type: ignore[arg-type]
    if check:
        raise RuntimeError(error)
    return error
