"""The engine cores one gateway fronts, found (or started) through Ray.

``RayCores`` is the ``EngineGroup`` of a gateway whose cores are Ray actors (ray_actor.py) on any
node: it connects this process to the cluster as a Ray driver, starts the cores itself
(``cores=``: ``voicewire serve --ray``; they live as long as this process) or finds those named in
the namespace (``voicewire gateway --ray``: started by ``voicewire engine``, detached, shared by
every gateway), keeps one ``RemoteCoreClient`` per core, and reconnects each one that goes down
once Ray has restarted it. Every ``DISCOVER_S`` it looks for cores added since, and forgets the
ones removed. Restarting cores is Ray's job (``max_restarts``); this side only follows.

Readiness is per core: the gateway serves while any core is ready (``ready``), and ``describe()``
says which ones are (``/readyz``), so a lost node makes its cores' turns fail, not every gateway.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from voicewire.engine import EngineConfig

from .client import CoreStartFailed, CoreState
from .group import GroupConfig, SharedCores
from .ray_actor import NAMESPACE, core_names, join_cluster, start_cores
from .ray_client import RemoteCoreClient
from .shared_core import CoreEndpoint

log = logging.getLogger("voicewire.engine.core")

DISCOVER_S = 2.0  # how often the namespace is listed for cores added or removed
LOCATE_TIMEOUT_S = 5.0  # an endpoint() call on a core Ray is still restarting waits this long
READY_TIMEOUT_S = 600.0  # cores this process starts: a Qwen3 core captures CUDA graphs first


@dataclass(frozen=True)
class OwnCores:
    """Cores this process starts (``serve --ray``), placed by ``resources`` and gone with it."""

    engine: EngineConfig
    replicas: int = 1
    resources: Mapping[str, float] = field(default_factory=dict)


class _Actor:
    """One named core actor, as this driver reaches it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handle: Any = None

    async def endpoint(self) -> CoreEndpoint:
        import ray

        loop = asyncio.get_running_loop()
        if self._handle is None:
            get = functools.partial(ray.get_actor, self.name, namespace=NAMESPACE)
            self._handle = await loop.run_in_executor(None, get)
        endpoint: CoreEndpoint = await asyncio.wait_for(self._handle.endpoint.remote(), LOCATE_TIMEOUT_S)
        return endpoint


class RayCores(SharedCores):
    start_cancellable = True  # start() waits until a core is ready: as long as it takes

    def __init__(self, address: str | None, cores: OwnCores | None = None) -> None:
        # Not EngineGroup's cores: the config is the first core's, once it is known.
        engine = cores.engine if cores is not None else EngineConfig()
        super().__init__(engine, GroupConfig(replicas=1))
        self.address = address  # None: a local cluster started in this process; "auto": a running one
        self.own = cores
        self.replicas.clear()  # filled as cores are found
        self._handles: list[Any] = []  # of the cores this process started
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self._discover: asyncio.Task[None] | None = None
        self._head_released = threading.Event()  # close(): a local cluster's head may go

    def describe(self) -> list[dict[str, Any]]:
        rows = super().describe()
        for row, core in zip(rows, self.replicas, strict=True):
            row["name"] = core.name
            endpoint = core.endpoint if isinstance(core, RemoteCoreClient) else None
            row["node"] = endpoint.node if endpoint is not None else None
            row["node_id"] = endpoint.node_id if endpoint is not None else None
            row["device"] = str(core.config.model_options.get("device", "cpu"))
        return rows

    async def start(self) -> RayCores:
        """Join the cluster, start or find the cores, and wait until one is ready (every one, for
        cores this process started: a core that cannot start fails the start, as on one host).
        Raises CoreStartFailed."""
        loop = asyncio.get_running_loop()
        try:
            await _in_daemon_thread(self._join, hold=self._head_released if self.address is None else None)
        except Exception as err:
            raise CoreStartFailed(f"cannot join the Ray cluster at {self.address or 'a new local one'}: {err}") from err
        if self.own is not None:
            made = await loop.run_in_executor(
                None,
                functools.partial(
                    start_cores, self.own.engine, self.own.replicas, resources=self.own.resources
                ),
            )
            self._handles = [h for _, h in made]
            failures = await asyncio.gather(
                *(asyncio.wait_for(h.wait_ready.remote(READY_TIMEOUT_S), READY_TIMEOUT_S + 5) for h in self._handles),
                return_exceptions=True,
            )
            failed = [f for f in failures if f is not None]
            if failed:
                await self.close()
                raise CoreStartFailed(str(failed[0]))
        await self._refresh()
        self._discover = asyncio.create_task(self._keep_discovering(), name="ray-discover")
        while not self.ready:
            await asyncio.sleep(0.1)
        if self.own is not None:
            while not all(r.ready for r in self.replicas):
                await asyncio.sleep(0.1)
        return self

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._keepers.values(), *([self._discover] if self._discover else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)
        if self._handles:
            await asyncio.get_running_loop().run_in_executor(None, self._stop_own)
        await asyncio.get_running_loop().run_in_executor(None, _leave)
        self._head_released.set()

    # --- below ---------------------------------------------------------------------------------
    def _join(self) -> None:
        import ray

        if not ray.is_initialized():
            join_cluster(self.address, include_dashboard=False if self.address is None else None)

    def _stop_own(self) -> None:
        import ray

        try:
            ray.get([h.shutdown.remote() for h in self._handles], timeout=15)
        except Exception as err:
            log.warning("not every core shut down cleanly: %s", err)
        for handle in self._handles:
            ray.kill(handle, no_restart=True)
        self._handles = []

    async def _keep_discovering(self) -> None:
        while True:
            await asyncio.sleep(DISCOVER_S)
            try:
                await self._refresh()
            except Exception:
                log.exception("listing the cores in Ray failed")

    async def _refresh(self) -> None:
        names = await asyncio.get_running_loop().run_in_executor(None, core_names)
        known = {r.name for r in self.replicas}
        for name in names:
            if name not in known:
                actor = _Actor(name)
                found = RemoteCoreClient(name, actor.endpoint)
                self.replicas.append(found)
                self._keepers[name] = asyncio.create_task(self._keep(found), name=f"keep-{name}")
                log.info("found engine core %s", name)
        for gone in [r for r in self.replicas if r.name not in names and r.state is not CoreState.READY]:
            log.info("engine core %s is gone from Ray", gone.name)
            self._keepers.pop(gone.name).cancel()
            self.replicas.remove(gone)
            await gone.close()

    async def _keep(self, core: RemoteCoreClient) -> None:
        await core.stay_connected(lambda: self._closing)


async def _in_daemon_thread(work: Callable[[], None], hold: threading.Event | None = None) -> None:
    """``work`` on a thread of its own that does not hold the process up: ``ray.init`` retries an
    unreachable cluster for a long time, and a gateway stopped meanwhile must still exit. ``hold``:
    the thread lives on after ``work`` until it is set. A local cluster needs that: Ray starts its
    head's processes (GCS, raylet) with PR_SET_PDEATHSIG, which kills them when the *thread* that
    started them ends, not the process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(err: BaseException | None) -> None:
        if not done.done():
            done.set_result(None) if err is None else done.set_exception(err)

    def run() -> None:
        try:
            work()
        except BaseException as err:
            loop.call_soon_threadsafe(settle, err)
        else:
            loop.call_soon_threadsafe(settle, None)
            if hold is not None:
                hold.wait()

    threading.Thread(target=run, name="ray-join", daemon=True).start()
    await done


def _leave() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
