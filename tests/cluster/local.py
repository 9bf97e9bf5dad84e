"""A real multi-node Ray cluster on this machine: a head and workers, each a separate `ray start` with its own CPUs.

Used by the cluster tests and the replica benchmark; ``make cluster`` runs the same commands from the Makefile. The
head gets no CPUs (only Serve's controller lives there), so every replica runs on a worker node, one per CPU.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node: chunks are small, Ray's default (30 % of RAM) is far too much
START_TIMEOUT_S = 600  # one `ray start` (a loaded 2-core machine has taken 25 s for the head)
STOP_GRACE_S = 3.0  # stopping: how long the cluster's processes get to end on SIGTERM before SIGKILL
JOIN_WAIT_S = 120  # a node whose `ray start` gave up (Ray waits 30 s for its raylet) may still join: this long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """``workers`` worker nodes of ``cpus`` CPUs each, under a head node at ``127.0.0.1:<port>``.

    The nodes' worker processes import this checkout (``PYTHONPATH``), as the replicas of a real deployment import
    the installed voicebot. :meth:`stop` ends this cluster's processes only (another cluster on the machine, another
    test run's, keeps running).
    """

    def __init__(self, workers: int = 2, cpus: float = 1, port: int | None = None) -> None:
        self.workers = workers
        self.cpus = cpus
        self.port = port or free_port()
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                            os.environ.get("PYTHONPATH")])),
                    "RAY_USAGE_STATS_ENABLED": "0",
                    # Ray runs its workers at nice 15 by default: a replica beside any busy process then gets a few
                    # per cent of a core and speaks late (see the README's cluster section)
                    "RAY_worker_niceness": "0"}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ray(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(RAY), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start(self) -> LocalCluster:
        """Start the head, then the workers; a worker that did not come up is started once more. On any failure
        what was started is stopped."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LocalCluster:
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
        """Stop this cluster's processes, and only those (`ray stop` would end every Ray cluster of the machine,
        another test run's too)."""
        stop_cluster(self.port)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_cluster(port: int, grace_s: float = STOP_GRACE_S) -> int:
    """End the processes of the cluster whose head listens on ``port``: the head's and every node's Ray daemons
    (their command lines name the cluster's session folder, or its address) and everything they started (the
    replicas, Ray's agents); SIGTERM, then SIGKILL for what is left after ``grace_s``. Returns how many there were."""
    procs = _processes()
    session = next((_session_of(cmd) for cmd, _ in procs.values() if f"--gcs_server_port={port} " in cmd + " "), None)
    ours = {pid for pid, (cmd, _) in procs.items()
            if (session is not None and session in cmd) or re.search(rf"--(gcs-)?address=[^ ]*:{port}( |$)", cmd)}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(ours)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    ours.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(_alive(pid) for pid in ours) and time.monotonic() < deadline:
            time.sleep(0.1)
    return len(ours)


def _processes() -> dict[int, tuple[str, int]]:
    """Every process of this machine: pid -> (command line, parent pid)."""
    out: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry.name)] = (cmd, ppid)
    return out


def _session_of(cmd: str) -> str | None:
    found = re.search(r"(/\S*/session_\d{4}-\d\d-\d\d_[\d-]+_\d+_\d+)(/|\s|$)", cmd)
    return found.group(1) if found else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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


def main(argv: list[str] | None = None) -> int:
    """``make cluster`` / ``make cluster-stop``: start a local cluster (and return, leaving it running), or stop one."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.cluster.local", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("--port", type=int, required=True, help="the head node's port")
    ap.add_argument("--workers", type=int, default=2, help="worker nodes (start)")
    ap.add_argument("--cpus", type=float, default=1, help="CPUs of each worker node (start)")
    args = ap.parse_args(argv)
    if args.action == "stop":
        print(f"stopped the local Ray cluster at 127.0.0.1:{args.port} ({stop_cluster(args.port)} processes)")
        return 0
    try:
        cluster = LocalCluster(args.workers, args.cpus, args.port).start()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"a local Ray cluster at {cluster.address}: a head with no CPUs and {args.workers} worker nodes of "
          f"{args.cpus:g} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
