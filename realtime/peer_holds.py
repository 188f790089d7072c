"""A client's sessions and speech requests counted over every gateway process of a port (``serve
--workers N``), so that its quota (quotas.py) is the same whichever processes its connections reach.

The kernel spreads a client's connections over the processes (SO_REUSEPORT hashes each one's
address and port), so counts per process would let one client hold N times its quota. Each hold is
a file in the directory the processes share, in a folder per client: ``holds/<client>/<kind>.<pid>.<n>``.
A hold is taken by creating its file first and counting the folder after, so two processes taking
the last one at once both see it over and both give it back: a client never holds more than its
quota, at worst one is refused that could have been admitted. A process that dies leaves its files;
whoever restarts it forgets them (``forget``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from pathlib import Path


class PeerHolds:
    def __init__(self, peers_dir: str | os.PathLike[str]) -> None:
        self._root = Path(peers_dir) / "holds"
        self._root.mkdir(exist_ok=True)
        self._names = (f"{os.getpid()}.{n}" for n in itertools.count())

    def take(self, client_id: str, kind: str, quota: int) -> Path | None:
        """A hold of ``kind`` for ``client_id`` if it then holds at most ``quota`` over every process
        (give it back with ``give``); None if it would hold more."""
        folder = self._root / hashlib.sha256(client_id.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        hold = folder / f"{kind}.{next(self._names)}"
        while True:
            folder.mkdir(exist_ok=True)
            try:
                os.close(os.open(hold, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                break
            except FileNotFoundError:  # its last hold was given back by another process meanwhile
                continue
        if sum(name.startswith(f"{kind}.") for name in os.listdir(folder)) > quota:
            self.give(hold)
            return None
        return hold

    @staticmethod
    def give(hold: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            hold.unlink()
        with contextlib.suppress(OSError):  # not empty: other holds of the client remain
            hold.parent.rmdir()


def forget(peers_dir: str | os.PathLike[str], pid: int) -> None:
    """Give back every hold of process ``pid``, which has ended."""
    for hold in (Path(peers_dir) / "holds").glob(f"*/*.{pid}.*"):
        PeerHolds.give(hold)
