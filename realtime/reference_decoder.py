"""A reference clip decoded in a process of its own, so that FFmpeg's crashes are one upload's error.

PyAV and FFmpeg read whatever a client uploads, and they can crash on it: PyAV's ``to_ndarray``
segfaults on a planar frame of 8 or more channels (a 1.6 KB WAV did it), and a codec may have
bugs of its own. Here a crash kills a child process; the gateway answers that upload 422
``undecodable_audio`` and nothing else notices.

    gateway (decode_in_process)                     child (python -m voicewire.realtime.reference_decoder LIMITS)
    the file on stdin, then EOF            ->       refuses by the stream's parameters before decoding,
                                                    then decodes at most max_duration_s of samples
                                           <-       one JSON line: {"rate_hz", "samples"} | {"status", "code", "message"}
                                                    then ``samples`` float32 (little-endian) of mono PCM

One child per upload (uploads at once are bounded by ``ReferenceLimits.max_uploads``): Python,
numpy and PyAV start in about 150 ms, small against a clone, and no file can leave state behind for
the next. The child imports nothing of voicewire (the engine stays out of it). Past the timeout it
is killed. What a file does to the decoder: ``python -m voicewire.realtime.reference_decoder
'{"max_duration_s": 30, "max_channels": 2, "min_sample_rate_hz": 8000, "max_sample_rate_hz": 192000}'
< file.wav | head -1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import av
import numpy as np

# This interpreter runs the child, with the module by name, as installed.
DECODER_COMMAND = (sys.executable, "-m", "voicewire.realtime.reference_decoder")


class BadAudio(ValueError):
    """An upload that cannot be used; ``status`` and ``code`` go to the client."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class DecodeLimits:
    """What the child refuses before (channels, rate) and while (length) it decodes."""

    max_duration_s: float
    max_channels: int
    min_sample_rate_hz: int
    max_sample_rate_hz: int


async def decode_in_process(
    data: bytes, limits: DecodeLimits, command: Sequence[str], timeout_s: float
) -> tuple[np.ndarray, int]:
    """(S,) float32 mono and its rate, decoded by a child process. Raises BadAudio: the child's own
    refusals (``not_audio``, ``unsupported_channels``, ``unsupported_sample_rate``,
    ``audio_too_long``), or 422 ``undecodable_audio`` when it crashed, failed or ran past
    ``timeout_s`` (then it is killed). A cancelled caller kills it too."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        json.dumps(asdict(limits)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(data), timeout_s)
    except TimeoutError:
        raise _undecodable(f"took longer than {timeout_s:g} s and was stopped") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    code = await proc.wait()  # done already: communicate() read to the end
    if code != 0:
        died = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        raise _undecodable(died)
    return _parse(out, limits)


def _parse(out: bytes, limits: DecodeLimits) -> tuple[np.ndarray, int]:
    line, _, body = out.partition(b"\n")
    try:
        head = json.loads(line)
        refused = (
            BadAudio(int(head["status"]), str(head["code"]), str(head["message"])) if "code" in head else None
        )
        rate, samples = (0, 0) if refused else (int(head["rate_hz"]), int(head["samples"]))
    except (ValueError, KeyError, TypeError):
        raise _undecodable("answered outside its protocol") from None
    if refused is not None:
        raise refused
    if len(body) != samples * 4 or samples > limits.max_duration_s * rate + 1:
        raise _undecodable(f"sent {len(body)} bytes for {samples} samples")
    return np.frombuffer(body, "<f4").astype(np.float32), rate


def _undecodable(what: str) -> BadAudio:
    return BadAudio(422, "undecodable_audio", f"the file could not be decoded: the decoder process {what}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- the child ---------------------------------------------------------------------------------------
def decode(data: bytes, limits: DecodeLimits) -> tuple[np.ndarray, int]:
    """(S,) float32 mono (the channels averaged) at the clip's own rate. Raises BadAudio, and
    PyAV's errors for what FFmpeg cannot read."""
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise BadAudio(400, "not_audio", "the file has no audio stream")
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        _check(int(ctx.channels or 0), int(ctx.sample_rate or 0), limits, known=False)
        rate = int(ctx.sample_rate or 0)
        max_samples = 0
        resampler: av.AudioResampler | None = None
        parts: list[np.ndarray] = []
        samples = 0
        for frame in container.decode(stream):
            # A stream may change its layout or rate mid-way: each frame is checked again before
            # any of it is converted.
            _check(len(frame.layout.channels), frame.sample_rate, limits, known=True)
            if resampler is None:
                rate = frame.sample_rate
                max_samples = int(limits.max_duration_s * rate)
                # Packed float: one (1, n x C) array per frame. PyAV's to_ndarray of a planar
                # frame of 8 or more channels reads past its plane pointers (the crash above).
                resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=rate)
            elif frame.sample_rate != rate:
                raise BadAudio(400, "not_audio", "the sample rate changes within the file")
            for out in resampler.resample(frame):
                parts.append(_mono(out))
                samples += parts[-1].size
            if samples > max_samples:
                raise BadAudio(
                    400, "audio_too_long", f"reference audio is limited to {limits.max_duration_s:g} s"
                )
        if resampler is not None:
            parts += [_mono(out) for out in resampler.resample(None)]
    if not parts or not rate:
        raise BadAudio(400, "not_audio", "no audio could be decoded from the file")
    pcm = np.concatenate(parts).astype(np.float32)
    if pcm.size > max_samples:
        raise BadAudio(400, "audio_too_long", f"reference audio is limited to {limits.max_duration_s:g} s")
    return pcm, rate


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """A packed float frame, (1, n x C) interleaved -> (n,) float32, the channels averaged."""
    return frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1, dtype=np.float32)


def _check(channels: int, rate_hz: int, limits: DecodeLimits, *, known: bool) -> None:
    """``known``: a decoded frame's figures (0 is wrong); else the container's (0: not said yet)."""
    if channels > limits.max_channels or (known and channels < 1):
        raise BadAudio(
            400,
            "unsupported_channels",
            f"reference audio has at most {limits.max_channels} channels, this has {channels}",
        )
    if (known or rate_hz) and not limits.min_sample_rate_hz <= rate_hz <= limits.max_sample_rate_hz:
        raise BadAudio(
            400,
            "unsupported_sample_rate",
            f"reference audio is sampled at {limits.min_sample_rate_hz}-{limits.max_sample_rate_hz} Hz, "
            f"this at {rate_hz} Hz",
        )


def main() -> None:
    limits = DecodeLimits(**json.loads(sys.argv[1]))
    data = sys.stdin.buffer.read()
    pcm: np.ndarray | None = None
    try:
        pcm, rate = decode(data, limits)
        head: dict[str, object] = {"rate_hz": rate, "samples": pcm.size}
    except BadAudio as err:
        head = {"status": err.status, "code": err.code, "message": err.message}
    except Exception:  # FFmpeg's errors, and PyAV's ValueErrors on frames it cannot convert
        head = {"status": 400, "code": "not_audio", "message": "the file is not audio FFmpeg can read"}
    out = sys.stdout.buffer
    out.write(json.dumps(head).encode() + b"\n")
    if pcm is not None:
        out.write(np.ascontiguousarray(pcm, "<f4").tobytes())
    out.flush()


if __name__ == "__main__":
    main()
