"""Gateway processes on one port, as ``voicewire serve --workers N`` and ``voicewire gateway --ray
--workers N`` run them: N copies of a gateway command line with ``--reuse-port`` (SO_REUSEPORT: the
kernel spreads new connections over them; a session is one connection, so it stays on its process).

What the processes of one port must agree on travels with them: one HMAC key for session tokens
(``TOKEN_SECRET_ENV``, this one's where set, else a random one), and a directory they share
(``--peers-dir``): a token is spent there once whichever process redeems it, each client's sessions
and speech requests are counted there over all of them (peer_holds.py), and each keeps a socket
there through which any one answers ``/metrics`` for all (peer_metrics.py). SIGTERM or
SIGINT goes to each (each drains); one that dies after it served a while is started again, one that
dies at once (a taken port, a bad flag: it said why) ends them all.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .auth import TOKEN_SECRET_ENV
from .peer_holds import forget

RESTART_UPTIME_S = 10.0  # a process that ran this long and died is restarted; a quicker death ends it all
POLL_S = 0.2


class GatewayProcesses:
    def __init__(self, n: int, argv: list[str], what: str) -> None:
        """``argv``: one process's command line; ``what``: how the messages name the command."""
        self.n, self.what = n, what
        self._dir = Path(tempfile.mkdtemp(prefix="voicewire-gateways-"))
        (self._dir / "spent-tokens").mkdir()
        self.argv = [*argv, "--reuse-port", "--peers-dir", str(self._dir)]
        self.env = {**os.environ, TOKEN_SECRET_ENV: os.environ.get(TOKEN_SECRET_ENV) or secrets.token_hex(32)}
        self._procs: list[tuple[subprocess.Popen[bytes], float]] = []
        self._stopping = False

    def run(self, tend: Callable[[], bool] = lambda: True) -> int:
        self.start()
        return self.watch(tend)

    def start(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self._procs = [(self._spawn(), time.monotonic()) for _ in range(self.n)]

    def watch(self, tend: Callable[[], bool] = lambda: True) -> int:
        """Until every process has ended; ``tend()`` runs between looks (False: stop them all, exit
        code 1). Returns the exit code."""
        code = 0
        try:
            while any(p.poll() is None for p, _ in self._procs):
                time.sleep(POLL_S)
                if not self._stopping and not tend():
                    code = 1
                    self.stop()
                for i, (p, t_start) in enumerate(self._procs):
                    rc = p.poll()
                    if rc is None or self._stopping:
                        continue
                    if rc != 0 and time.monotonic() - t_start > RESTART_UPTIME_S:
                        print(f"{self.what}: gateway process {p.pid} died ({rc}); starting another", file=sys.stderr)
                        forget(self._dir, p.pid)  # its clients' sessions and speech requests ended with it
                        self._procs[i] = (self._spawn(), time.monotonic())
                    elif rc != 0:
                        code = code or rc
                        self.stop()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        return code

    def stop(self, signum: int = signal.SIGTERM, frame: object = None) -> None:
        self._stopping = True
        for p, _ in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv, env=self.env)
