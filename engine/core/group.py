"""Replicas: N engine cores, one process each, spread over devices, supervised.

Replica ``i`` runs on ``devices[i % len(devices)]``, so ``--replicas 4 --devices cuda:0,cuda:1``
puts two cores on each GPU. Which replica serves what is the gateway's choice (a session sticks
to one); the group owns their lives: ``start`` brings every core up (a core that cannot start
its model fails the whole start, as an in-process engine would), then one supervisor per core
restarts it whenever it dies, after a backoff that doubles from ``RESTART_BACKOFF_S`` up to
``MAX_RESTART_BACKOFF_S`` and resets once a core has stayed up ``STABLE_UPTIME_S``. A core whose
heartbeat stops for ``hang_timeout_s`` is killed, and so restarted, too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from voicewire.engine import EngineConfig

from .client import CoreClient, CoreStartFailed, CoreState

log = logging.getLogger("voicewire.engine.core")

RESTART_BACKOFF_S = 0.5
MAX_RESTART_BACKOFF_S = 30.0
STABLE_UPTIME_S = 60.0
HANG_TIMEOUT_S = 30.0  # heartbeats come every 0.5 s; a core silent this long is stuck


@dataclass(frozen=True)
class GroupConfig:
    replicas: int = 1
    devices: tuple[str, ...] = ("cpu",)
    restart_backoff_s: float = RESTART_BACKOFF_S
    max_restart_backoff_s: float = MAX_RESTART_BACKOFF_S
    hang_timeout_s: float = HANG_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if not self.devices or not all(self.devices):
            raise ValueError(f"devices must name at least one device, got {self.devices}")
        if self.hang_timeout_s <= 0:
            raise ValueError(f"hang_timeout_s must be > 0, got {self.hang_timeout_s}")


class EngineGroup:
    start_cancellable = False  # a gateway that stops while start() runs waits for it (then closes the cores)

    def __init__(self, config: EngineConfig, group: GroupConfig | None = None) -> None:
        self.config = config
        self.group = group or GroupConfig()
        devices = self.group.devices
        self.replicas = [
            CoreClient(config, name=f"replica-{i}", device=devices[i % len(devices)])
            for i in range(self.group.replicas)
        ]
        self._supervisors: list[asyncio.Task[None]] = []
        self._closing = False

    @property
    def ready(self) -> bool:
        """Every replica is warm and stepping."""
        return all(r.ready for r in self.replicas)

    def describe(self) -> list[dict[str, Any]]:
        """Per-replica state for /readyz and /healthz."""
        return [
            {
                "replica": i,
                "state": r.state.value,
                "device": r.device or "default",
                "pid": r.pid,
                "active_streams": r.active_streams(),
                "max_streams": r.max_streams,
                "restarts": r.restarts,
                "last_exit": r.last_exit,
            }
            for i, r in enumerate(self.replicas)
        ]

    async def start(self) -> EngineGroup:
        """Start every core and wait until all are warm; then supervise them. Raises CoreStartFailed."""
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.close()
            raise failed[0] if isinstance(failed[0], CoreStartFailed) else CoreStartFailed(str(failed[0]))
        self._supervisors = [
            asyncio.create_task(self._supervise(r), name=f"supervise-{r.name}") for r in self.replicas
        ]
        return self

    async def close(self) -> None:
        self._closing = True
        for task in self._supervisors:
            task.cancel()
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)

    async def __aenter__(self) -> EngineGroup:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _supervise(self, core: CoreClient) -> None:
        backoff_s = self.group.restart_backoff_s
        t_up = time.monotonic()
        watchdog = asyncio.create_task(self._watch_heartbeat(core))
        try:
            while not self._closing:
                await core.wait_exit()
                if self._closing:
                    return
                if time.monotonic() - t_up > STABLE_UPTIME_S:
                    backoff_s = self.group.restart_backoff_s
                log.warning("%s is down (%s); restarting in %.1f s", core.name, core.last_exit, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, self.group.max_restart_backoff_s)
                try:
                    await core.start()
                except CoreStartFailed as err:
                    log.error("%s failed to restart: %s", core.name, err)
                    continue
                t_up = time.monotonic()
                log.info("%s is back (pid %s, restart %d)", core.name, core.pid, core.restarts)
        finally:
            watchdog.cancel()

    async def _watch_heartbeat(self, core: CoreClient) -> None:
        while True:
            await asyncio.sleep(1.0)
            if core.state is CoreState.READY and core.silent_s() > self.group.hang_timeout_s:
                log.error("%s sent nothing for %.0f s; killing it", core.name, core.silent_s())
                core.kill()


class SharedCores(EngineGroup):
    """Cores that other gateways front too (Ray's, or ``serve --workers``'): this gateway serves
    while any of them is ready, and each row says what the core holds for every gateway."""

    @property
    def ready(self) -> bool:
        return any(r.ready for r in self.replicas)

    def describe(self) -> list[dict[str, Any]]:
        rows = super().describe()
        for row, core in zip(rows, self.replicas, strict=True):
            row["core_streams"] = core.load()  # every gateway's, as the core reports it
            row["streams_opened"] = core.stats.streams_opened  # the core's count, every gateway's
        return rows
