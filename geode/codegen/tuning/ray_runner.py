"""Candidates measured on a Ray cluster's workers (``geode.tune(..., ray=ADDRESS)``).

The driver searches as it does alone (:func:`~geode.codegen.tuning.search.tune_kernel`)
and hands each batch of candidates to a :class:`RayMeasurer`. Each candidate travels
as its schedule's trace (JSON) with the kernel's lowered form, its input arrays, the
run's dims and the default's outputs (put once in Ray's object store per kernel); a
remote task (:func:`measure_on_worker`) replays the trace on the lowered kernel
(checking it gives the same kernel as on the driver), compiles it with geode on the
worker, checks its outputs and times it, with the native pool pinned to the driver's
thread count and the task holding as many of the cluster's CPUs. A worker whose device
(CPU, target, threads: :func:`~geode.codegen.tuning_db.device_fingerprint`) is not the
driver's refuses to measure: its times would be recorded under the wrong device. The
default and the finalists are timed by one task on one worker in interleaved rounds, so
they are compared under the same conditions. A task that fails (the worker crashed,
Ray lost it) leaves its candidate failed; the search goes on.

Ray is imported only by :func:`connect` (``ray`` is the ``geode[ray]`` extra); every
worker must have geode installed (a local instance's workers inherit the driver's
environment).
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geode.codegen.lower import LoweredKernel
from geode.codegen.schedule import Schedule, Trace
from geode.codegen.schedule.trace_json import replay_checked
from geode.codegen.tuning.measure import KernelBench, Measured, mismatch, schedule_digest
from geode.codegen.tuning_db import device_fingerprint
from geode.config import Options
from geode.errors import GeodeError, TuningError

#: the addresses that start a Ray instance on this machine instead of joining a cluster
LOCAL_ADDRESSES = ("local", "auto")

#: CPUs of a local instance: one task at a time at two threads, so candidates timed
#: at once never share a core
LOCAL_CPUS = 2

#: seconds to wait for a cluster's address to answer before calling it unreachable
CONNECT_TIMEOUT_S = 3.0

#: the extra that installs Ray
EXTRA = "ray"


@dataclass
class Cluster:
    """A Ray connection: the module, the address it was made with, whether
    :func:`connect` started it (then :meth:`close` stops it) and the CPUs it has."""

    ray: Any
    address: str
    started: bool
    cpus: int

    def close(self) -> None:
        """Stop the instance if :func:`connect` started it."""
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()


def import_ray() -> Any:
    """The ``ray`` module; TuningError naming the extra when it is not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise TuningError(
            f"distributed tuning needs Ray, which is not installed ({exc}): "
            f"pip install 'geode[{EXTRA}]'"
        ) from None


def connect(address: str) -> Cluster:
    """Join the Ray cluster at ``address`` (``host:port`` or ``ray://host:port``), or
    start one on this machine for ``local``/``auto`` (:data:`LOCAL_CPUS` CPUs, no
    dashboard); an instance already running in this process is used as it is.
    TuningError naming the address when it is malformed or does not answer."""
    if not isinstance(address, str) or not address.strip():
        raise TuningError(f"ray={address!r}: expected 'local', 'auto' or HOST:PORT")
    address = address.strip()
    local = address in LOCAL_ADDRESSES
    if not local:
        host, port = _host_port(address)
        _reachable(address, host, port)
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        try:
            if local:
                ray.init(num_cpus=LOCAL_CPUS, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError
            raise TuningError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from None
        started = True
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return Cluster(ray, address, started, max(1, cpus))


def _host_port(address: str) -> tuple[str, int]:
    """``address``'s host and port; TuningError when it is not ``[ray://]HOST:PORT``."""
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TuningError(
            f"ray={address!r}: not a Ray address; expected 'local', 'auto', HOST:PORT "
            "or ray://HOST:PORT"
        )
    return host.strip("[]"), int(port)


def _reachable(address: str, host: str, port: int) -> None:
    """TuningError naming ``address`` when nothing listens at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise TuningError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None


@dataclass(frozen=True)
class KernelPayload:
    """What a worker needs to measure candidates of one kernel: the lowered kernel the
    traces replay on, the arguments, the options (``num_threads`` the driver's thread
    count), the bench's settings, the default's outputs and the driver's device."""

    name: str
    lowered: LoweredKernel
    inputs: list[np.ndarray]
    env: dict[str, int]
    opts: Options
    bench: dict[str, Any]
    want: list[np.ndarray]
    threads: int
    device: str


def measure_on_worker(
    payload: KernelPayload, traces: Sequence[tuple[str, str]], rounds: int = 0
) -> list[tuple[float | None, str | None]]:
    """Run on a worker: replay each ``(trace JSON, digest)`` on the payload's kernel,
    compile and check it, and time it; ``(seconds, None)`` or ``(None, why)`` per
    trace. With ``rounds`` > 0 the traces are timed in that many interleaved rounds
    (the min of the rounds), as :meth:`KernelBench.confirm_many`."""
    try:
        bench = _worker_bench(payload)
    except GeodeError as exc:
        return [(None, str(exc))] * len(traces)
    runs: list[Callable[[], list[np.ndarray]] | None] = []
    out: list[tuple[float | None, str | None]] = []
    for text, digest in traces:
        try:
            sch = _replay(payload, text, digest)
            run = bench.runner(sch)
            wrong = mismatch(run(), payload.want)
            if wrong is not None:
                runs.append(None)
                out.append((None, f"wrong results: {wrong}"))
                continue
            runs.append(run)
            out.append((None if rounds else bench.time(run).seconds, None))
        except GeodeError as exc:
            runs.append(None)
            out.append((None, f"{type(exc).__name__}: {exc}"))
    if rounds:
        ok = [i for i, r in enumerate(runs) if r is not None]
        times = bench.confirm_many([runs[i] for i in ok], rounds)  # type: ignore[misc]
        for i, t in zip(ok, times):
            out[i] = (t, None)
    return out


def _worker_bench(payload: KernelPayload) -> KernelBench:
    """The worker's bench, its native pool pinned to the driver's thread count;
    TuningError when the worker is another device than the driver."""
    from geode.runtime.native import get_num_threads, set_num_threads

    if get_num_threads() != payload.threads:
        set_num_threads(payload.threads)
    here = device_fingerprint(payload.threads)
    if here != payload.device:
        raise TuningError(
            f"worker {socket.gethostname()} is device {here}, not the driver's "
            f"{payload.device}: its times would be recorded under the wrong device"
        )
    return KernelBench(
        payload.name, payload.lowered, payload.inputs, payload.env, payload.opts, **payload.bench
    )


def _replay(payload: KernelPayload, text: str, digest: str) -> Schedule:
    """The schedule of trace ``text`` on the payload's kernel; TuningError when it is
    not the kernel the driver built (``digest``)."""
    sch = replay_checked(Trace.from_json(text, "candidate"), payload.lowered.kernel, "candidate")
    if schedule_digest(sch) != digest:
        raise TuningError(f"kernel {payload.name}: the trace replays to another kernel")
    return sch


class RayMeasurer:
    """A search's candidates measured on ``cluster``'s workers, a batch at a time
    (``width``: the CPUs over the threads per candidate). ``worker``: the remote
    function's body (default :func:`measure_on_worker`)."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        lowered: LoweredKernel,
        inputs: Sequence[np.ndarray],
        env: dict[str, int],
        opts: Options,
        threads: int,
        device: str,
        bench_options: dict[str, Any] | None = None,
        worker: Callable[..., Any] = measure_on_worker,
    ):
        self.cluster = cluster
        self.threads = max(1, int(threads))
        self.width = max(1, cluster.cpus // self.threads)
        self._fixed = (name, lowered, [np.ascontiguousarray(a) for a in inputs], dict(env))
        self._opts = opts.replace(num_threads=self.threads)
        self._device, self._bench = device, dict(bench_options or {})
        ray = cluster.ray
        self._remote = ray.remote(worker).options(num_cpus=self.threads, max_retries=0)
        self._payload: Any = None

    def start(self, default: Schedule) -> float:
        """Compute the default's outputs here (the reference the workers check
        against), put the kernel in the object store and time the default on a worker."""
        name, lowered, inputs, env = self._fixed
        local = KernelBench(name, lowered, inputs, env, self._opts)
        want = [o.copy() for o in local.runner(default)()]
        payload = KernelPayload(
            name, lowered, inputs, env, self._opts, self._bench, want, self.threads, self._device
        )
        self._payload = self.cluster.ray.put(payload)
        (got,) = self.measure([default])
        if got.seconds is None:
            raise TuningError(f"kernel {name}: the default schedule failed on Ray: {got.error}")
        return got.seconds

    def measure(self, schedules: Sequence[Schedule]) -> list[Measured]:
        """One remote task per schedule, all submitted at once; a task that fails
        leaves its candidate failed."""
        refs = [self._remote.remote(self._payload, [_wire(sch)]) for sch in schedules]
        return [self._get(ref, 1)[0] for ref in refs]

    def confirm(self, schedules: Sequence[Schedule], rounds: int = 5) -> list[float]:
        """``schedules`` timed by one task, on one worker, in interleaved rounds; a
        schedule that fails there counts as infinitely slow."""
        ref = self._remote.remote(self._payload, [_wire(s) for s in schedules], rounds)
        got = self._get(ref, len(schedules))
        return [m.seconds if m.seconds is not None else float("inf") for m in got]

    def _get(self, ref: Any, n: int) -> list[Measured]:
        """The task's results, or ``n`` failures naming what Ray raised."""
        ray = self.cluster.ray
        try:
            return [Measured(s, e) for s, e in ray.get(ref)]
        except ray.exceptions.RayError as exc:
            why = f"Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            return [Measured(None, why)] * n


def _wire(sch: Schedule) -> tuple[str, str]:
    """What travels for one candidate: its trace as JSON and its kernel's digest."""
    return sch.trace.to_json(indent=None), schedule_digest(sch)
