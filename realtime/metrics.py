"""Prometheus metrics for one gateway (its own registry, so tests can run several apps)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from voicewire.engine import Engine

TTFP_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class _EngineCollector(Collector):
    """Engine counters read at scrape time (the worker thread writes them; reads are plain ints)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        st = self._engine.stats
        yield GaugeMetricFamily(
            "voicewire_engine_streams_active", "Streams the engine holds", self._engine.active_streams()
        )
        yield CounterMetricFamily("voicewire_engine_steps", "Engine steps run", st.steps)
        yield CounterMetricFamily(
            "voicewire_engine_generate_seconds", "Time in model.generate", st.generate_s
        )
        yield CounterMetricFamily("voicewire_engine_decode_seconds", "Time in model.decode", st.decode_s)
        yield CounterMetricFamily("voicewire_engine_frames", "Frames generated", st.frames_generated)
        yield GaugeMetricFamily(
            "voicewire_engine_last_step_seconds", "Duration of the last step", st.last_step_s
        )
        batches = CounterMetricFamily(
            "voicewire_engine_batches", "Generate steps by batch size", labels=["size"]
        )
        for size, n in sorted(dict(st.batch_sizes).items()):
            batches.add_metric([str(size)], n)
        yield batches


class GatewayMetrics:
    def __init__(self, engine: Engine) -> None:
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
        r.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
