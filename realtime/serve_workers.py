"""``voicewire serve --workers N``: N gateway processes on one port in front of the engine cores this
process starts and supervises, on one host and without Ray.

One gateway's event loop takes every session's messages, audio and connects: at a few hundred new
turns a second on a GPU that is a whole core, and its collections walk every open session's
objects. N processes share that, each with its own loop and
heap, in front of the same cores:

    this process   one SharedCore per replica (engine/core/shared_core.py): the core binds its
                   gateways' TCP sockets on 127.0.0.1; where they are goes to a file (host_cores.py)
    N workers      `voicewire serve <the same flags> --workers 1 --cores-file FILE` on the port
                   (gateway_procs.py): each a full gateway whose group is HostCores

A core that ends after it was ready is started again (after a backoff that doubles, as
EngineGroup's) and the file rewritten: the workers reconnect to it. One that hangs alive is killed
once its heartbeat has stopped for ``--hang-timeout`` (SharedCore), and so started again too. A core that cannot start its
model ends everything with its error, as one process would. SIGTERM or SIGINT: every worker drains
(``--drain-timeout``), then the cores stop.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from voicewire.engine import EngineConfig
from voicewire.engine.core.client import engine_on
from voicewire.engine.core.group import MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S, STABLE_UPTIME_S, GroupConfig
from voicewire.engine.core.host_cores import write_endpoints
from voicewire.engine.core.shared_core import CoreEndpoint, SharedCore

from .gateway_procs import GatewayProcesses

log = logging.getLogger("voicewire.serve")

HOST = "127.0.0.1"  # the cores' gateway sockets: only this host's workers reach them
LISTEN_S = 60.0  # a core binds its sockets before its model loads: seconds at most
CORES_PER_WORKER = 4  # the default: a gateway process per this many CPU cores...
MAX_AUTO_WORKERS = 4  # ...up to this many


def add_worker_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"gateway processes on this port in front of the engine cores (SO_REUSEPORT; default: one "
        f"per {CORES_PER_WORKER} CPU cores, at most {MAX_AUTO_WORKERS}, when the engine runs in core "
        "processes; else 1)",
    )
    serve.add_argument("--cores-file", help=argparse.SUPPRESS)  # each worker: where the cores listen


def workers_for(args: argparse.Namespace, cores: bool) -> int:
    """Gateway processes for ``serve``'s flags; ``cores``: the engine runs in core processes.
    Raises ValueError for a count that cannot be."""
    if args.workers is not None:
        if args.workers < 1:
            raise ValueError("--workers must be 1 or more")
        if args.workers > 1 and (not cores or args.ray is not None):
            raise ValueError(
                "--workers needs engine cores this command starts (--replicas 1 or more, no --ray; "
                "across hosts: voicewire gateway --ray --workers N)"
            )
        return int(args.workers)
    if not cores or args.ray is not None or args.cores_file:
        return 1
    return max(1, min(MAX_AUTO_WORKERS, (os.cpu_count() or 1) // CORES_PER_WORKER))


class _Core:
    """One replica: its current incarnation, started again when it ends after it was ready."""

    def __init__(self, index: int, engine: EngineConfig, hang_timeout_s: float) -> None:
        self.index, self.engine, self.hang_timeout_s = index, engine, hang_timeout_s
        self.shared: SharedCore | None = None
        self.ended = threading.Event()  # the current incarnation's process ended
        self.served = False  # some incarnation was ready: a later one that fails is retried
        self.backoff_s = RESTART_BACKOFF_S
        self.t_up = 0.0
        self.restart_at: float | None = None

    def start(self) -> CoreEndpoint:
        self.ended.clear()
        self.shared = SharedCore(self.engine, HOST, f"replica-{self.index}", self._on_exit, self.hang_timeout_s)
        self.shared.start()
        self.t_up = time.monotonic()
        deadline = self.t_up + LISTEN_S
        while True:
            try:
                return self.shared.endpoint(HOST, "")
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def _on_exit(self, code: int, was_ready: bool) -> None:  # on the SharedCore's thread
        self.served = self.served or was_ready
        self.ended.set()

    def stop(self) -> None:
        if self.shared is not None:
            self.shared.stop()


class Supervisor:
    def __init__(self, workers: int, child_argv: list[str], engine: EngineConfig, group: GroupConfig) -> None:
        self.workers = workers
        self._dir = Path(tempfile.mkdtemp(prefix="voicewire-serve-"))
        self.endpoints_file = self._dir / "cores"
        argv = [*child_argv, "--workers", "1", "--cores-file", str(self.endpoints_file)]
        self.gateways = GatewayProcesses(workers, argv, "voicewire serve")
        devices = group.devices
        self.cores = [
            _Core(i, engine_on(engine, devices[i % len(devices)]), group.hang_timeout_s)
            for i in range(group.replicas)
        ]
        self._endpoints: list[CoreEndpoint] = []

    def run(self) -> int:
        """The gateway processes first (their port answers health probes at once, and a port that is
        taken ends it all before a model loads), then the cores; the processes wait for the file."""
        try:
            self.gateways.start()
            try:
                self._endpoints = [core.start() for core in self.cores]
            except (TimeoutError, RuntimeError) as err:
                print(f"voicewire serve: an engine core did not start: {err}", file=sys.stderr)
                self.gateways.stop()
                self.gateways.watch()
                return 1
            write_endpoints(self.endpoints_file, self._endpoints)
            log.info("%d gateway processes in front of %d engine cores", self.workers, len(self.cores))
            return self.gateways.watch(tend=self._tend_cores)
        finally:
            for core in self.cores:
                core.stop()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _tend_cores(self) -> bool:
        """Start again each core that ended after it was ready; False: one failed before it was."""
        for core in self.cores:
            if not core.ended.is_set():
                continue
            assert core.shared is not None
            if not core.served:
                print(f"voicewire serve: the model failed to start: {core.shared.failure}", file=sys.stderr)
                return False
            now = time.monotonic()
            if core.restart_at is None:
                if now - core.t_up > STABLE_UPTIME_S:
                    core.backoff_s = RESTART_BACKOFF_S
                log.warning("replica-%d's core ended; starting it again in %.1f s", core.index, core.backoff_s)
                core.restart_at = now + core.backoff_s
                core.backoff_s = min(2 * core.backoff_s, MAX_RESTART_BACKOFF_S)
            if now < core.restart_at:
                continue
            core.restart_at = None
            core.stop()
            try:
                self._endpoints[core.index] = core.start()
            except (TimeoutError, RuntimeError) as err:
                log.error("replica-%d's core did not start again: %s", core.index, err)
                continue
            write_endpoints(self.endpoints_file, self._endpoints)
        return True
