"""``voicewire serve --ray`` with no address: a local Ray cluster started inside the gateway's own
process tree, its core placed by Ray, gone when the gateway stops (docs/across-hosts.md, "For one
host and a quick try"). The front-door benchmark runs the GPU this way (``SERVE_FLAGS=--ray``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.ray_cluster import kill_trees
from tests.conftest import free_port
from voicewire.realtime.client import VoicewireClient

from .conftest import BIN, psutil, ray
from .test_across_hosts import readyz, say, until

pytestmark = [pytest.mark.ray, pytest.mark.slow]


async def test_serve_with_a_local_cluster_serves_and_leaves_no_process(tmp_path: Path) -> None:
    assert ray is not None
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="vwlocal-", dir="/tmp")  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a cluster of its own
    # a home of its own: a new local cluster writes its token to ~/.ray, which a later
    # `ray start --head` on this machine would take up
    env.update(RAY_TMPDIR=temp_dir, RAY_USAGE_STATS_ENABLED="0", HOME=str(tmp_path / "home"))
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "voicewire"), "serve", "--ray", "--port", str(port)],
            env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # Ray starts the head's GCS and raylet with PR_SET_PDEATHSIG: started from a thread that
        # then ends, they die at once and no core ever turns ready
        _, body = await until(lambda: (s := readyz(port))[0] == 200 and s, 60.0, "serve --ray ready")
        (core,) = body["replicas"]
        assert core["state"] == "ready" and core["node"]
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert {"gcs_server", "raylet"} <= {p.name() for p in tree}
        client = await VoicewireClient.connect(f"ws://127.0.0.1:{port}/v1/stream")
        got = await say(client, "One core, placed by Ray on this machine.")
        await client.close()
        assert got.done.reason == "completed" and got.pcm().size > 24_000 // 2
        proc.send_signal(signal.SIGTERM)  # the gateway drains, stops its core and the cluster
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 15
        while (alive := [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert not alive, [p.name() for p in alive]
    finally:
        kill_trees([proc])
        shutil.rmtree(temp_dir, ignore_errors=True)
        print((tmp_path / "serve.log").read_text(errors="replace")[-4000:])
