"""One ``/metrics`` for every gateway process of a port (``serve --workers N``, ``gateway --ray
--workers N``).

The kernel hands a scrape to any one process, and each counts only its own sessions and turns: a
scraper would see counters that jump between processes. So each process also serves its own text
on a Unix socket in the directory the processes share (``metrics-<pid>.sock``), and the one asked
reads every other's and answers for all:

- the gateway's series (sessions, turns, TTFP, errors, quotas): summed per label set, as one
  gateway with every session would count them; the most streams one client holds: the largest;
- each process's own series (``process_*``, its loop's lag and stalls, its collections): kept
  apart, with a ``pid`` label;
- the engine's series: the cores are the same behind every process, so this process's alone.

A process that does not answer within ``PEER_TIMEOUT_S`` is left out (``voicewire_gateway_processes``
says how many are in the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

PEER_TIMEOUT_S = 1.0
OWN = ("process_", "voicewire_gateway_")  # a process's own: kept apart by pid
ENGINE = "voicewire_engine_"  # the cores': the same in every process
LARGEST = {"voicewire_client_streams_max"}


def socket_path(peers_dir: str, pid: int | None = None) -> Path:
    return Path(peers_dir) / f"metrics-{pid or os.getpid()}.sock"


async def serve_own(peers_dir: str, render: Callable[[], bytes], pid: int | None = None) -> web.AppRunner:
    """This process's (``pid``'s) own text on its socket, for the others; the caller cleans the
    runner up."""

    async def own(request: web.Request) -> web.Response:
        return web.Response(body=render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/", own)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(socket_path(peers_dir, pid))).start()
    return runner


async def _peer_text(path: Path) -> str | None:
    try:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)),
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S),
            ) as http,
            http.get("http://peer/") as r,
        ):
            return await r.text() if r.status == 200 else None
    except aiohttp.ClientConnectorError as err:
        if isinstance(err.os_error, ConnectionRefusedError):  # nothing listens: that process is gone
            with contextlib.suppress(OSError):
                path.unlink()
        return None
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def render_all(peers_dir: str, own: bytes) -> bytes:
    """Every process's series in one text: this process's ``own``, the others' from their sockets."""
    mine = socket_path(peers_dir)
    others = [p for p in Path(peers_dir).glob("metrics-*.sock") if p != mine]
    texts = [own.decode(), *(t for t in await asyncio.gather(*map(_peer_text, others)) if t is not None)]
    registry = CollectorRegistry()
    registry.register(_Merged(texts))
    return generate_latest(registry)


class _Merged(Collector):
    def __init__(self, texts: list[str]) -> None:
        self._texts = texts

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for i, text in enumerate(self._texts):
            families = list(text_string_to_metric_families(text))
            pid = next(
                (s.labels["pid"] for f in families if f.name == "voicewire_gateway_process" for s in f.samples), "?"
            )
            for family in families:
                if family.name.startswith(ENGINE) and i > 0:
                    continue
                own = family.name.startswith(OWN) and family.name != "voicewire_gateway_process"
                if family.name not in merged:
                    merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                    values[family.name] = {}
                into = values[family.name]
                for s in family.samples:
                    labels = {**s.labels, "pid": pid} if own else s.labels
                    key = (s.name, tuple(sorted(labels.items())))
                    if key not in into:
                        into[key] = s.value
                    elif s.name.endswith("_created"):
                        into[key] = min(into[key], s.value)
                    elif family.name in LARGEST:
                        into[key] = max(into[key], s.value)
                    else:
                        into[key] += s.value
        for name, family in merged.items():
            for (sample, label_pairs), value in values[name].items():
                family.add_sample(sample, dict(label_pairs), value)
            yield family
        answered = GaugeMetricFamily("voicewire_gateway_processes", "Gateway processes of this port in this answer")
        answered.add_metric([], float(len(self._texts)))
        yield answered
