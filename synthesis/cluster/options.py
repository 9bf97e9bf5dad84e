"""The options of the synthesis replicas on Ray Serve (config ``ray:``), apart from the client and the replicas so
that loading the config costs no import of the pipeline or of Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass

STORAGE_MODES = ("shared", "served")  # ray.storage: how replicas reach the voices and caches


@dataclass(frozen=True)
class ClusterOptions:
    """Where the replicas run and how many there are: config ``ray:`` (defaults written here, checked here)."""

    address: str = "auto"  # auto (the cluster of `ray start` on this machine) | local (start one) | host:port
    app_name: str = "voicebot"  # the Serve application; a client attaches to it when it runs, else deploys it
    num_replicas: int = 1  # replicas when autoscaling is off
    autoscaling: bool = False  # scale on queue depth between min_replicas and max_replicas (Serve's autoscaler)
    min_replicas: int = 1
    max_replicas: int = 3
    target_queue: float = 8.0  # requests per replica (running + waiting) the autoscaler aims at
    upscale_delay_s: float = 30.0  # the load must be above target this long before a replica is added
    downscale_delay_s: float = 600.0  # ...and below it this long before one is removed
    scale_window_s: float = 30.0  # the queue depth the autoscaler follows is averaged over this window
    drain_timeout_s: float = 300.0  # a replica being removed finishes its requests for at most this long
    cpus_per_replica: float = 1.0  # Ray CPUs reserved per replica (and its engine threads when engine.threads: 0)
    gpus_per_replica: float = 0.0  # Ray GPUs per replica (1: one replica per GPU)
    max_queued_requests: int = 64  # requests waiting at one client for a free replica slot; one more is busy
    ready_timeout_s: float = 600.0  # how long start-up waits for the replicas (model load included)
    # shared: every replica opens voices.dir and cache.dir itself (all nodes on the machine that holds them)
    # served: one storage actor on the client's machine owns them; replicas on any machine call it
    storage: str = "shared"

    def __post_init__(self) -> None:
        if not self.address.strip():
            raise ValueError("address must be auto, local or a cluster address like 10.0.0.5:6379, got ''")
        if not self.app_name.strip() or not all(c.isalnum() or c in "-_" for c in self.app_name):
            raise ValueError(f"app_name must be letters, digits, - or _, got {self.app_name!r}")
        for name in ("num_replicas", "min_replicas", "max_replicas", "max_queued_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas must be >= min_replicas ({self.min_replicas}), got {self.max_replicas}")
        for name in ("target_queue", "cpus_per_replica", "ready_timeout_s", "scale_window_s"):
            _check_number(name, getattr(self, name), 0.0, above=True)
        for name in ("gpus_per_replica", "upscale_delay_s", "downscale_delay_s", "drain_timeout_s"):
            _check_number(name, getattr(self, name), 0.0, above=False)
        if self.storage not in STORAGE_MODES:
            raise ValueError(f"storage must be one of {', '.join(STORAGE_MODES)}, got {self.storage!r}")

    @property
    def capacity_replicas(self) -> int:
        """The most replicas there can be."""
        return self.max_replicas if self.autoscaling else self.num_replicas


def _check_number(name: str, value: object, lo: float, *, above: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or (float(value) <= lo if above else float(value) < lo):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a finite number {'above' if above else '>='} {lo:g}, got {value!r}")
