"""A real two-node Ray cluster on this machine, started the way docs/across-hosts.md says, with
the engine cores and gateways of that page: one per test module, torn down to the last process.

The two nodes are two raylets on 127.0.0.1 with distinct custom resources (``head_node``,
``node2``), so placement by resource is real; every port is picked free, every process is ours
(each ``ray start --block`` in a session of its own), and teardown kills exactly those trees.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.ray_cluster import kill_trees, node_ports
from tests.conftest import free_port
from voicewire.engine.core.ray_actor import join_cluster

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

DOC = Path(__file__).resolve().parents[2] / "docs" / "across-hosts.md"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 60.0


def doc_commands() -> list[str]:
    """Every command of the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


@dataclass
class Stack:
    """The cluster, its cores and its gateways, as the page starts them."""

    address: str
    env: dict[str, str]
    temp_dir: str
    gateway_a: int  # the page's gateway command: --workers 2 on one port
    gateway_b: int  # a second gateway host: the same command, one worker
    ran: list[list[str]] = field(default_factory=list)  # every command line taken from the page
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateways: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    gateway_argv: dict[int, list[str]] = field(default_factory=dict)
    gateway_env: dict[int, dict[str, str]] = field(default_factory=dict)

    def start_gateway(self, port: int) -> None:
        with open(Path(self.temp_dir) / f"gateway-{port}.log", "ab") as log:
            self.gateways[port] = subprocess.Popen(
                self.gateway_argv[port], env=self.gateway_env[port], start_new_session=True, stdout=log, stderr=subprocess.STDOUT
            )

    def stop_gateway(self, port: int, sig: int = signal.SIGTERM) -> int:
        proc = self.gateways.pop(port)
        os.killpg(proc.pid, sig)
        return proc.wait(30)

    def node2_tree(self) -> list[Any]:
        """The second node's raylet and every process under it (its workers, their cores)."""
        node = psutil.Process(self.nodes[1].pid)
        raylet = next(p for p in node.children(recursive=True) if p.name() == "raylet")
        return [raylet, *raylet.children(recursive=True)]


def _start_node(argv: list[str], env: dict[str, str], path: Path) -> subprocess.Popen[bytes]:
    with open(path, "ab") as log:
        return subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    commands = [shlex.split(c) for c in doc_commands()]
    make_token = next(c for c in commands if c[:2] == ["ray", "get-auth-token"])
    head = next(c for c in commands if c[:3] == ["ray", "start", "--head"])
    exports = next(c for c in commands if c[:1] == ["export"])
    worker = next(c for c in commands if c[:3] == ["ray", "start", "--address"])
    engines = [c for c in commands if c[:2] == ["voicewire", "engine"] and "--stop" not in c]
    gateway = next(c for c in commands if c[:2] == ["voicewire", "gateway"])
    temp_dir = tempfile.mkdtemp(prefix="vwray-", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Two "hosts", each with a home of its own: the head's holds the token the page makes; the
    # second node, the second gateway and this test's driver are given it as the page says.
    base = {**os.environ, "RAY_ADDRESS": address, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env = {**base, "HOME": str(Path(temp_dir) / "head")}
    made = subprocess.run([str(BIN / "ray"), *make_token[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    other_env = {**base, "HOME": str(Path(temp_dir) / "other")}
    other_env.update(dict(kv.split("=", 1) for kv in exports[1:]), RAY_AUTH_TOKEN=token)
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    head_argv = [
        str(BIN / "ray"), *_replace(head, "--port", str(port))[1:], *common, "--temp-dir", temp_dir,
        "--include-dashboard=false", "--ray-client-server-port", str(free_port()), *node_ports(),
    ]  # fmt: skip
    worker_argv = [str(BIN / "ray"), *_replace(worker, "--address", address)[1:], *common, *node_ports()]
    stack = Stack(address, env, temp_dir, gateway_a=free_port(), gateway_b=free_port())
    stack.ran += [make_token, head, exports, worker]
    driver_auth = {key: os.environ.get(key) for key in ("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    try:
        # The second node retries until the head's GCS answers: both start at once.
        stack.nodes.append(_start_node(head_argv, env, Path(temp_dir) / "head.log"))
        stack.nodes.append(_start_node(worker_argv, other_env, Path(temp_dir) / "node2.log"))
        # This process joins with the head's token file and no RAY_AUTH_MODE, by an explicit address
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(Path(env["HOME"]) / ".ray" / "auth_token")
        _join(address, nodes=2)
        for c in engines:  # in the page's order: the first core is core-0
            out = subprocess.run([str(BIN / "voicewire"), *c[1:]], env=env, capture_output=True, timeout=START_TIMEOUT_S)
            assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
        stack.ran += engines
        for gw_port, argv, gw_env in (
            (stack.gateway_a, gateway, env),
            (stack.gateway_b, _replace(gateway, "--workers", "1"), other_env),
        ):
            argv = _replace(_replace(argv, "--port", str(gw_port)), "--host", "127.0.0.1")
            stack.gateway_argv[gw_port] = [str(BIN / "voicewire"), *argv[1:]]
            stack.gateway_env[gw_port] = gw_env
            stack.start_gateway(gw_port)
        stack.ran.append(gateway)
        yield stack
    finally:
        for gw_port in list(stack.gateways):
            try:
                stack.stop_gateway(gw_port, signal.SIGKILL)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if ray.is_initialized():
            ray.shutdown()
        for key, value in driver_auth.items():  # join_cluster turned this process's token mode on
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        kill_trees(stack.nodes)
        for log in sorted(Path(temp_dir).glob("*.log")):  # shown with a failing test's output
            print(f"--- {log.name}", *log.read_text(errors="replace").splitlines()[-40:], sep="\n")
        shutil.rmtree(temp_dir, ignore_errors=True)


def _join(address: str, nodes: int) -> None:
    """This test process joins the cluster as a driver (to kill actors, as an operator would)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if not ray.is_initialized():
                join_cluster(address)
            if sum(n["Alive"] for n in ray.nodes()) >= nodes:
                return
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the Ray cluster at {address} did not reach {nodes} nodes")
        time.sleep(0.5)
