"""`--master ray`: the job's splits on a Ray cluster's GPUs, through the same split scheduler.

    driver (this process)                       Ray cluster
    SplitScheduler + split_driver.drive  <--->  SplitActor x ray.num_workers  (one engine each,
      one reader thread per actor,                num_gpus=1, or ray.num_cpus_per_worker CPUs)
      polling its events

The driver connects to the cluster named by `--master ray://HOST:PORT` (Ray Client),
`ray.address` or RAY_ADDRESS, and starts a local one when none is named (as Spark's local mode
does). Every actor pulls splits from the driver; a dead actor's splits are reassigned and a
replacement actor starts (at most `ray.max_restarts` in a run). Commits are the same
create-if-absent markers as `local[N]`: an actor killed at any instant, or a driver killed and
run again, ends with every row exactly once.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from typing import Any

from shardinfer.errors import EXIT_RETRYABLE, ConfigError, Retryable, UsageError, exit_code_for
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.split_driver import Inbox, RunStats, drive
from shardinfer.jobs.split_scheduler import SplitScheduler
from shardinfer.pipeline.job import OpenedJob

POLL_S = 0.5  # how long one poll of an actor waits for an event
RELAY_END_S = 10.0  # how long shutdown waits for a killed actor's relay thread to end
CONNECT_TIMEOUT_S = 10.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UsageError(
            f"--master ray needs Ray ({exc}): pip install 'shardinfer[ray]' (Ray >= 2.40), here and on the cluster"
        ) from None
    return ray


def cluster_address(master: str, configured: str) -> str:
    """The address to connect to: ray://... from --master, else ray.address, else RAY_ADDRESS, else ""."""
    if master.startswith("ray://"):
        return master
    if master != "ray":
        raise UsageError(
            f"--master {master!r}: use ray (cluster from ray.address / RAY_ADDRESS) or ray://HOST:PORT"
        )
    return configured or os.environ.get("RAY_ADDRESS", "")


def check_reachable(address: str) -> None:
    """Fail fast, naming the address, when nothing listens there: ray.init would wait for minutes."""
    if not address or address == "auto":
        return
    hostport = address.removeprefix("ray://").split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"Ray address {address!r} is not HOST:PORT or ray://HOST:PORT; fix ray.address or RAY_ADDRESS"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise Retryable(
            f"cannot reach the Ray cluster at {address!r} ({exc}); check that the cluster is up and that "
            "--master / ray.address / RAY_ADDRESS name its head node"
        ) from None


def connect(ray: Any, address: str, reporter: Reporter) -> None:
    check_reachable(address)
    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            # "local": a new cluster even where an earlier `ray start` left its address file behind.
            ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
            reporter.info("started a local Ray cluster (no ray.address or RAY_ADDRESS given)")
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        where = address or "a new local cluster"
        raise Retryable(f"cannot connect to the Ray cluster at {where!r}: {exc}") from None


def plan_actors(ray: Any, cfg: Any) -> tuple[int, dict[str, Any]]:
    """(number of actors, options of each): one GPU each when the cluster has GPUs."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    cpus = float(cfg.num_cpus_per_worker)
    if cpus <= 0:
        raise ConfigError(f"ray.num_cpus_per_worker={cfg.num_cpus_per_worker} must be > 0")
    options: dict[str, Any] = {"max_concurrency": 8, "max_restarts": 0, "num_cpus": cpus}
    if gpus:
        options["num_gpus"] = 1
        default = gpus
    else:
        default = max(1, int(resources.get("CPU", 1) // cpus))
        options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(max(1, int(cpus)))}}
    if cfg.resources:
        options["resources"] = dict(cfg.resources)
    n = cfg.num_workers or default
    if n < 1:
        raise ConfigError(f"ray.num_workers={cfg.num_workers} must be >= 1 (or 0 for one per GPU)")
    return n, options


class RayCluster:
    """The driver's connection to a Ray cluster, held for one run."""

    def __init__(self, master: str, cfg: Any, reporter: Reporter) -> None:
        self.ray = import_ray()
        self.cfg = cfg
        self.reporter = reporter
        connect(self.ray, cluster_address(master, cfg.address), reporter)
        self.inbox: Inbox = queue.Queue()
        self._num_workers, self._options = plan_actors(self.ray, cfg)
        self._actor_class = self.ray.remote(_actor_class())
        self._prestarted: dict[str, RayWorker] = {}
        self._prestarted_config: dict[str, Any] | None = None

    def resolve_device(self, config: Any) -> None:
        """model.device "auto" means the workers' devices, not this machine's: GPUs when the cluster
        has them (the fingerprint records the numerics the actors will use)."""
        if config.model.device == "auto":
            config.model.device = "cuda" if self.ray.cluster_resources().get("GPU", 0) else "cpu"

    def prestart(self, config: Any) -> None:
        """Start the actors now, so each loads its engine while this driver lists and plans the
        input; they open the job only once `run` tells them it is planned."""
        self._prestarted_config = config.to_dict()
        for slot in range(self._num_workers):
            name = str(slot)  # the names the split driver gives its first workers
            self._prestarted[name] = RayWorker(
                self.ray,
                self._actor_class,
                self._options,
                name,
                self._prestarted_config,
                self.cfg.model_cache_dir,
                self.inbox,
                self.reporter,
            )

    def run(
        self,
        job: OpenedJob,
        scheduler: SplitScheduler,
        stop: threading.Event,
        reporter: Reporter,
        stats: RunStats,
    ) -> int:
        """Run the scheduler's splits on actors; returns how many actors it started with."""
        num_workers, options = self._num_workers, self._options
        config = job.config.to_dict()
        if config != self._prestarted_config:  # never run a job on engines built for another config
            for worker in self._prestarted.values():
                worker.kill()
            self._prestarted.clear()

        def start(name: str, slot: int) -> RayWorker:
            worker = self._prestarted.pop(name, None) or RayWorker(
                self.ray,
                self._actor_class,
                options,
                name,
                config,
                self.cfg.model_cache_dir,
                self.inbox,
                reporter,
            )
            worker.begin()
            return worker

        restarts = self.cfg.max_restarts if self.cfg.max_restarts >= 0 else num_workers
        reporter.info("Ray worker actors", workers=num_workers, options=json.dumps(options, default=str))
        drive(scheduler, self.inbox, start, num_workers, reporter, stats, stop, max_restarts=restarts)
        return num_workers

    def shutdown(self) -> None:
        """Disconnect. Prestarted actors the run never took (a plan that failed, a job already
        done) still have relay threads waiting inside Ray calls, and shutting Ray down under them
        can crash the process as it exits: they are killed and their relays let end first."""
        for worker in self._prestarted.values():
            worker.kill()
        for worker in self._prestarted.values():
            worker.join(RELAY_END_S)
        self._prestarted.clear()
        self.ray.shutdown()


def _actor_class() -> type:
    from shardinfer.jobs.ray_worker import SplitActor

    return SplitActor


class RayWorker:
    """The driver's side of one actor: its `run` call and a thread relaying its events."""

    def __init__(
        self,
        ray: Any,
        actor_class: Any,
        options: dict[str, Any],
        name: str,
        config: dict[str, Any],
        model_cache_dir: str,
        inbox: Inbox,
        reporter: Reporter,
    ) -> None:
        self.name = name
        self._ray = ray
        self._actor = actor_class.options(**options).remote(config, name, model_cache_dir)
        self._run = self._actor.run.remote()
        self._reporter = reporter
        self._thread = threading.Thread(target=self._relay, args=(inbox,), daemon=True)
        self._thread.start()

    def begin(self) -> None:
        self._actor.begin.remote()

    def give(self, split: Any | None) -> None:
        self._actor.give.remote(split.to_dict() if split is not None else None)

    def terminate(self) -> None:
        self._actor.stop.remote()

    def kill(self) -> None:
        self._ray.kill(self._actor, no_restart=True)

    def join(self, timeout: float) -> None:
        """Wait for the relay thread to end (it does once the actor's run ends or the actor dies)."""
        self._thread.join(timeout)

    def _relay(self, inbox: Inbox) -> None:
        ray = self._ray
        started = False
        try:
            while True:
                events = ray.get(self._actor.poll.remote(POLL_S))
                if not started:
                    started = True
                    pid = ray.get(self._actor.pid.remote())
                    self._reporter.log("debug", "worker actor started", worker=self.name, pid=pid)
                for event in events:
                    inbox.put((self.name, event))
                done, _ = ray.wait([self._run], timeout=0)
                if done:
                    for event in ray.get(self._actor.poll.remote(0)):
                        inbox.put((self.name, event))
                    result = ray.get(self._run)
                    inbox.put((self.name, {"event": "worker_done", **result}))
                    inbox.put((self.name, {"event": "exited", "code": 0}))
                    return
        except Exception as exc:  # the actor died or its run raised: report it as a worker exit
            inbox.put((self.name, _exit_event(ray, exc)))


def _exit_event(ray: Any, exc: BaseException) -> dict[str, Any]:
    exceptions = ray.exceptions
    if isinstance(exc, exceptions.RayTaskError):
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
        code = exit_code_for(cause)
        return {"event": "exited", "code": code, "reason": f"exit code {code}: {cause}"}
    actor_gone = tuple(
        getattr(exceptions, name)
        for name in ("RayActorError", "ActorUnavailableError")
        if hasattr(exceptions, name)
    )
    if isinstance(exc, actor_gone):
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return {"event": "exited", "code": -9, "reason": f"actor died: {type(exc).__name__}: {first_line}"}
    return {"event": "exited", "code": EXIT_RETRYABLE, "reason": f"lost contact: {type(exc).__name__}: {exc}"}
