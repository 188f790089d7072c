"""The distribution as a user installs it: a wheel built from the tree, in a fresh venv, beside
PyPI's own `realtime` and `kernels` packages (generic names voicewire must not claim), then
`voicewire serve` from that venv serving the demo page and speaking."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
# The other owners of the names: Supabase's realtime client, Hugging Face's kernel hub.
NEIGHBOURS = ("realtime==2.34.1", "kernels==0.17.2")


def _run(*cmd: str | Path, timeout_s: float = 600, **kw: object) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout_s, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return str(proc.stdout)


@pytest.mark.slow
def test_wheel_installs_beside_pypi_realtime_and_kernels_and_serves(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    assert "BuildBackendWarning" not in build.stderr, build.stderr[-4000:]  # e.g. a deprecated license table
    (wheel,) = wheels.glob("voicewire-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    # The neighbours first, then voicewire: neither may overwrite the other's files.
    # --no-compile: what is checked is the files installed, not their bytecode (a third of the time)
    _run(py, "-m", "pip", "install", "-q", "--no-compile", *NEIGHBOURS)
    _run(py, "-m", "pip", "install", "-q", "--no-compile", wheel)
    out = _run(
        py,
        "-c",
        "import realtime, kernels, voicewire.realtime, voicewire.engine, voicewire.kernels, json;"
        "print(json.dumps([realtime.__file__, kernels.__file__, voicewire.realtime.__file__]))",
        cwd=tmp_path,  # not the repo: only what was installed can be imported
    )
    theirs_rt, theirs_k, ours = json.loads(out)
    assert "voicewire" not in theirs_rt and "voicewire" not in theirs_k
    assert str(venv) in ours and "/voicewire/realtime/" in ours
    # Uninstalling a neighbour leaves voicewire whole (it once deleted our `realtime/` folder).
    _run(py, "-m", "pip", "uninstall", "-q", "-y", "realtime")
    _run(py, "-c", "import voicewire.realtime.server", cwd=tmp_path)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen(
        [venv / "bin" / "voicewire", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/", timeout=5) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        with urllib.request.urlopen(f"{base}/static/app.js", timeout=5) as r:
            assert r.status == 200
        req = urllib.request.Request(
            f"{base}/v1/audio/speech",
            data=json.dumps({"input": "Installed from a wheel.", "response_format": "pcm"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            pcm = r.read()
        assert len(pcm) > 24_000  # over half a second of 24 kHz PCM16
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output[-3000:]
