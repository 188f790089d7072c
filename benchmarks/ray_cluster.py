"""A local Ray cluster for the benchmarks: a head and, if asked, a second raylet on the same host with
a custom resource of its own (as docs/across-hosts.md starts them), each on free ports, in a temp dir
of its own; ``LocalCluster`` stops every process it started, the workers under them too.

    with LocalCluster(second_node=True) as cluster:
        cluster.spawn([*VOICEWIRE, "gateway", "--ray", cluster.address, ...], "gateway")
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

BIN = Path(sys.executable).parent
# as modules of this interpreter: where nothing is installed (the device's link tree) too
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
VOICEWIRE = [sys.executable, "-m", "voicewire.realtime.cli"]


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process: the kernel may give a
    just-closed port to the next bind, and a Ray node started with two such would fail on its own."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def node_ports() -> list[str]:
    """Ports a raylet and its agents would otherwise take at fixed defaults (two nodes, one host)."""
    flags = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")  # fmt: skip
    return [a for f in flags for a in (f, str(free_port()))]


def ready(port: int, timeout_s: float) -> None:
    """Until the gateway on ``port`` answers /readyz 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway on {port} was not ready within {timeout_s:.0f} s")


def kill_trees(procs: list[subprocess.Popen[bytes]]) -> None:
    """Each process, its process group (each was started in a session of its own) and all under it
    (a raylet's workers, the engine actors among them)."""
    import psutil

    tree: list[Any] = []
    for proc in procs:
        try:
            tree += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


class LocalCluster:
    def __init__(self, second_node: bool = False, cpus: int = 1) -> None:
        self.second_node, self.cpus = second_node, cpus
        self.temp = tempfile.mkdtemp(prefix="vwray-", dir="/tmp")  # Ray's socket paths must stay short
        self.address = f"127.0.0.1:{free_port()}"
        self.env = {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": f"{BIN}:{os.environ['PATH']}",
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LocalCluster:
        common = [
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(self.cpus),
            "--disable-usage-stats",
        ]
        try:
            self.spawn([*RAY, "start", "--head", "--port", self.address.split(":")[1], "--resources",
                        '{"head_node": 1}', *common, "--temp-dir", self.temp, "--include-dashboard=false",
                        "--ray-client-server-port", str(free_port()), *node_ports()], "head")  # fmt: skip
            if self.second_node:
                self.spawn([*RAY, "start", "--address", self.address, "--resources", '{"node2": 1}', *common,
                            *node_ports()], "node2")  # fmt: skip
            self.wait_for_nodes(2 if self.second_node else 1)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        """A process of the cluster's (its own session, its log in the temp dir), stopped with it."""
        with open(Path(self.temp) / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, env=self.env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout_s: float) -> None:
        """A command to completion (``voicewire engine`` returns once its cores are warm)."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stdout}{done.stderr}")

    def wait_for_nodes(self, nodes: int, timeout_s: float = 60.0) -> None:
        import ray

        from voicewire.engine.core.ray_actor import join_cluster

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not ray.is_initialized():
                    join_cluster(self.address)
                if sum(n["Alive"] for n in ray.nodes()) >= nodes:
                    ray.shutdown()
                    return
            except (ConnectionError, RuntimeError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster at {self.address} did not reach {nodes} nodes")

    def stop(self) -> None:
        kill_trees(self.procs)
        self.procs.clear()
        shutil.rmtree(self.temp, ignore_errors=True)
