"""The engine cores that one of several gateway processes on a host fronts (``voicewire serve
--workers N``): cores the serve command's supervisor started (realtime/serve_workers.py) with their
gateways' TCP sockets on the loopback address, reached as Ray's gateways reach theirs
(``RemoteCoreClient``, ray_client.py). The supervisor writes where each core listens to a file
(``write_endpoints``) and rewrites it whenever it restarts one; a gateway reads it each time it
(re)connects, so a restarted core is found as Ray's are, without Ray.

Readiness and ``/readyz``'s rows are ``SharedCores``' (group.py), as Ray's gateways have them.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path
from typing import Any

from voicewire.engine import EngineConfig

from .group import GroupConfig, SharedCores
from .ray_client import RemoteCoreClient
from .shared_core import CoreEndpoint


def write_endpoints(path: Path, endpoints: list[CoreEndpoint]) -> None:
    """Replace the file at once: a gateway reading it sees the old list or the new one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(endpoints))
    os.replace(tmp, path)


def read_endpoints(path: Path) -> list[CoreEndpoint]:
    endpoints = pickle.loads(path.read_bytes())
    assert isinstance(endpoints, list) and all(isinstance(e, CoreEndpoint) for e in endpoints)
    return endpoints


class HostCores(SharedCores):
    start_cancellable = True  # start() waits until the cores are ready: as long as their warm-up takes

    def __init__(self, endpoints_file: str | os.PathLike[str], config: EngineConfig) -> None:
        super().__init__(config, GroupConfig(replicas=1))
        self.path = Path(endpoints_file)
        self.replicas.clear()  # one client per core of the file, made at start

    async def start(self) -> HostCores:
        """Connect to every core of the file once it is there, and wait until each is ready (the
        supervisor ends this process if one cannot start its model)."""
        while not self.path.exists():  # the supervisor starts its gateways before its cores
            await asyncio.sleep(0.05)
        count = len(read_endpoints(self.path))
        for i in range(count):
            core = RemoteCoreClient(f"replica-{i}", self._locator(i))
            self.replicas.append(core)
            # EngineGroup's close() cancels these and closes the clients
            self._supervisors.append(
                asyncio.create_task(core.stay_connected(lambda: self._closing), name=f"keep-replica-{i}")
            )
        while not all(r.ready for r in self.replicas):
            await asyncio.sleep(0.05)
        return self

    def _locator(self, i: int) -> Any:
        async def locate() -> CoreEndpoint:
            return read_endpoints(self.path)[i]

        return locate
