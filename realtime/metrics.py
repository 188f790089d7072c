"""Prometheus metrics for one gateway (its own registry, so tests can run several apps)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from voicewire.engine import Engine, heap
from voicewire.engine.core import CoreClient
from voicewire.engine.loop_lag import LoopLag

from .quotas import ClientLedger

TTFP_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class _EngineCollector(Collector):
    """Engine counters read at scrape time, one series per replica (label ``replica``): an
    in-process engine's worker writes them, a core's arrive with its heartbeat (every 0.5 s).
    A restarted core counts from zero again, which Prometheus reads as a counter reset."""

    def __init__(self, engines: Sequence[Engine | CoreClient]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["replica"])

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["replica"])

        series: list[tuple[GaugeMetricFamily | CounterMetricFamily, Callable[[Engine | CoreClient], float]]] = [
            (gauge("voicewire_engine_streams_active", "Streams the engine holds"), lambda e: e.active_streams()),
            (counter("voicewire_engine_steps", "Engine steps run"), lambda e: e.stats.steps),
            (counter("voicewire_engine_generate_seconds", "Time in model.generate"), lambda e: e.stats.generate_s),
            (counter("voicewire_engine_decode_seconds", "Time in model.decode"), lambda e: e.stats.decode_s),
            (
                counter(
                    "voicewire_engine_device_wait_seconds",
                    "Of the generate and decode seconds, the time spent waiting for the model's device",
                ),
                lambda e: e.stats.device_wait_s,
            ),
            (counter("voicewire_engine_frames", "Frames generated"), lambda e: e.stats.frames_generated),
            (counter("voicewire_engine_commands", "Stream commands handled (opens, text, ends)"), lambda e: e.stats.commands),
            (
                counter("voicewire_engine_command_seconds", "Worker time in stream commands, between steps"),
                lambda e: e.stats.commands_s,
            ),
            (
                counter("voicewire_engine_gc_collections", "Garbage collections in the engine's process, every generation"),
                lambda e: e.stats.gc_collections,
            ),
            (
                counter("voicewire_engine_gc_pause_seconds", "Time the garbage collector held the engine's process"),
                lambda e: e.stats.gc_pause_s,
            ),
            (
                gauge("voicewire_engine_gc_pause_max_seconds", "The longest garbage collection in the engine's process"),
                lambda e: e.stats.gc_pause_max_s,
            ),
            (
                gauge(
                    "voicewire_engine_gc_pause_max_since_ready_seconds",
                    "The longest garbage collection in the engine's process since it turned ready",
                ),
                lambda e: e.stats.gc_pause_max_since_ready_s,
            ),
            (counter("voicewire_engine_voices_cloned", "Voices cloned from reference audio"), lambda e: e.stats.voices_cloned),
            (gauge("voicewire_engine_last_step_seconds", "Duration of the last step"), lambda e: e.stats.last_step_s),
            (gauge("voicewire_engine_ready", "1 while the replica is warm and stepping"), lambda e: float(e.ready)),
        ]
        batches = CounterMetricFamily(
            "voicewire_engine_batches", "Generate steps by batch size", labels=["replica", "size"]
        )
        for i, engine in enumerate(self._engines):
            for family, value in series:
                family.add_metric([str(i)], value(engine))
            for size, n in sorted(dict(engine.stats.batch_sizes).items()):
                batches.add_metric([str(i), str(size)], n)
        for family, _ in series:
            yield family
        yield batches


class _ProcessCollector(Collector):
    def __init__(self, lag: LoopLag) -> None:
        self._lag = lag

    def collect(self) -> Iterator[Metric]:
        lag = self._lag
        # which gateway process answered: with several on one port (serve --workers) each has its own
        info = GaugeMetricFamily("voicewire_gateway_process", "This gateway process (its pid)", labels=["pid"])
        info.add_metric([str(os.getpid())], 1.0)
        yield info
        yield GaugeMetricFamily(
            "voicewire_gateway_loop_lag_max_since_ready_seconds",
            "The longest the gateway's event loop ran late since ready",
            value=lag.max_since_mark_s,
        )
        yield CounterMetricFamily(
            "voicewire_gateway_loop_stalls",
            f"Times the gateway's event loop ran {lag.stall_s * 1000:g} ms or more late",
            value=lag.stalls,
        )
        yield GaugeMetricFamily(
            "voicewire_gateway_gc_pause_max_since_ready_seconds",
            "The longest garbage collection in the gateway's process since ready",
            value=heap.PAUSES.max_since_mark_s,
        )


class GatewayMetrics:
    def __init__(self, engines: Sequence[Engine | CoreClient]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttfp = Histogram(
            "voicewire_ttfp_seconds",
            "First text of a turn to its first audio sent",
            ["transport"],
            buckets=TTFP_BUCKETS_S,
            registry=r,
        )
        self.sessions = Gauge("voicewire_sessions_active", "Open sessions", ["transport"], registry=r)
        self.turns = Counter("voicewire_turns", "Turns finished", ["transport", "reason"], registry=r)
        self.underruns = Counter(
            "voicewire_underruns",
            "Audio sent after the client's playback would have run dry",
            ["transport"],
            registry=r,
        )
        self.errors = Counter(
            "voicewire_errors", "Errors sent to clients or requests refused", ["code"], registry=r
        )
        # per-client refusals by quota (quotas.py), without a label per client
        self.quota_refusals = Counter(
            "voicewire_quota_refusals", "Requests and turns refused by a per-client quota", ["quota"], registry=r
        )
        r.register(_EngineCollector(engines))
        ProcessCollector(registry=r)  # the gateway process's CPU seconds and memory (process_*)

    def watch_clients(self, ledger: ClientLedger) -> None:
        """Gauges of the clients holding anything (quotas.py): how many, and the most streams one holds."""
        Gauge("voicewire_clients_active", "Clients holding a session, request or stream", registry=self.registry).set_function(
            lambda: float(ledger.active())
        )
        Gauge(
            "voicewire_client_streams_max", "The most engine streams one client holds", registry=self.registry
        ).set_function(lambda: float(ledger.most_streams()))

    def watch_process(self, lag: LoopLag) -> None:
        """The gateway process's own holds since ready (``serve``): its event loop late for every
        session at once, and its garbage collector's pauses (an engine core's are the engine's)."""
        self.registry.register(_ProcessCollector(lag))

    def render(self) -> bytes:
        return generate_latest(self.registry)
