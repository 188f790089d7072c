"""The listener every underrun figure assumes.

Playback starts when the first audio of a turn arrives (plus ``buffer_s``, zero by default) and
runs in real time. Audio that is not there when its turn to play comes stalls playback: that is
one underrun, and playback resumes the moment the audio arrives. The gateway counts a turn's
underruns with it as it hands audio to the transport, the probe and the benchmarks as audio
reaches the client, so a server figure and a client figure differ only by the wire.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Playout:
    """Feed it each piece of a turn's audio as it arrives (``arrive``), in order."""

    buffer_s: float = 0.0  # how long after the first arrival playback starts
    underruns: int = 0  # stalls: a piece arrived after the audio before it had played out
    stall_s: float = 0.0  # total time playback waited
    max_stall_s: float = 0.0  # the longest single wait
    max_stall_end_s: float | None = None  # when the longest wait ended (perf_counter clock)
    end_s: float | None = None  # when everything received so far has played (perf_counter clock)

    def arrive(self, t_s: float, duration_s: float) -> float:
        """A piece of ``duration_s`` seconds arrived at ``t_s``; returns when it starts playing."""
        if self.end_s is None:
            self.end_s = t_s + self.buffer_s
        elif t_s > self.end_s:
            self.underruns += 1
            self.stall_s += t_s - self.end_s
            if t_s - self.end_s > self.max_stall_s:
                self.max_stall_s, self.max_stall_end_s = t_s - self.end_s, t_s
            self.end_s = t_s
        start = self.end_s
        self.end_s += duration_s
        return start
