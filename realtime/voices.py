"""Cloned voices the gateway keeps: content-addressed, persisted on disk, loaded at start.

A voice is what the engine derived from one reference clip (``ClonedVoice``: the model's arrays,
the transcript, the encoder that made them) plus a name. Its id is a digest of everything the
derivation depends on (the encoder, the decoded samples and their rate, the transcript), so the
same reference uploaded again, in any container, is found instead of computed again; and a voice
of another model (another encoder) never answers to a lookup of this one.

On disk, one pair of files per voice in the voices directory (``voicewire serve --voices-dir``):

    <id>.safetensors   the arrays (safetensors, numpy), written first
    <id>.json          the manifest (name, encoder, transcript, duration, created_at, owner), written
                       last: a voice exists once its manifest does, so a crash mid-write leaves
                       no half voice, and two voices never share a file that both rewrite

The owner is the client that uploaded it (``clients.client_id``) and what the per-client quota
counts; a manifest without one (written before owners were kept) counts for no client. A store
holds at most ``ReferenceLimits.max_voices`` voices in all and ``max_voices_per_client`` of one
owner, clones under way included; past them an upload is refused (507 ``voice_store_full``, 429
``voice_quota_exceeded``), but one that finds its voice already there is not. A voice whose
arrays hold NaN or infinity is never stored (422 ``non_finite_voice``) nor loaded.

A store without a directory keeps its voices in memory (an embedded gateway, tests). A shared one
(``shared``: other gateway processes serve the same port and directory, ``voicewire serve
--workers``) takes the directory as the truth: before each lookup it reads what another process
added or deleted since (one ``stat`` of the directory when nothing changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voicewire.engine import CLONED_VOICE_KEY, ClonedVoice, ModelInfo, StreamParams

from .reference_audio import ReferenceAudio, ReferenceLimits

log = logging.getLogger("voicewire.voices")

ID_PREFIX = "voice_"
MAX_NAME_CHARS = 64
MAX_TRANSCRIPT_CHARS = 1000  # the transcript joins the prompt: about a minute of speech at most
MANIFEST_VERSION = 1  # "owner" joined it as an optional key: readers of either kind read both


class Cloner(Protocol):
    """What the store needs of an engine replica (``Engine`` or ``CoreClient``)."""

    @property
    def info(self) -> ModelInfo: ...

    async def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str = "") -> ClonedVoice: ...


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    cloned: ClonedVoice
    duration_s: float  # of the reference clip
    sample_rate_hz: int  # the clip's own rate
    created_at: float  # unix seconds
    owner: str = ""  # the client that uploaded it (clients.client_id); "": none known. Not shown.

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "voice",
            "name": self.name,
            "type": "cloned",
            "transcript": self.cloned.ref_text,
            "in_context": bool(self.cloned.ref_text),  # the transcript is used: in-context cloning
            "duration_s": round(self.duration_s, 3),
            "created_at": int(self.created_at),
            "encoder": self.cloned.encoder,
        }


class VoiceError(Exception):
    """A request about voices that cannot be honoured; ``status`` and ``code`` go to the client."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def check_name(name: str) -> str:
    """The name as stored (whitespace trimmed); VoiceError for an empty, long or control-laden one."""
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS or any(unicodedata.category(c)[0] == "C" for c in name):
        raise VoiceError(400, "invalid_name", f"a voice name is 1 to {MAX_NAME_CHARS} printable characters")
    if name.casefold().startswith(ID_PREFIX):  # VOICE_<id> would answer to a lookup of that id
        raise VoiceError(400, "invalid_name", f"a voice name may not start with {ID_PREFIX!r} (ids do)")
    return name


def voice_id(encoder: str, ref: ReferenceAudio, transcript: str) -> str:
    h = hashlib.sha256()
    for part in (b"voicewire-voice-v1", encoder.encode(), str(ref.sample_rate_hz).encode()):
        h.update(part + b"\0")
    h.update(np.ascontiguousarray(ref.pcm, "<f4").tobytes())
    h.update(b"\0" + transcript.encode())
    return ID_PREFIX + h.hexdigest()[:24]


class VoiceStore:
    def __init__(self, directory: str | os.PathLike[str] | None = None, *, shared: bool = False) -> None:
        self.directory = Path(directory).expanduser() if directory is not None else None
        self.shared = shared and self.directory is not None
        self._seen_ns = -1  # the directory's mtime when this process last read it (shared)
        self._voices: dict[str, Voice] = {}
        self._pending: dict[str, asyncio.Future[Voice]] = {}  # clones under way, by id
        self._pending_names: set[tuple[str, str]] = set()  # (encoder, casefolded name) of those
        self._pending_owners: Counter[str] = Counter()  # their owners

    # --- lookups --------------------------------------------------------------------------------
    def voices(self, encoder: str) -> list[Voice]:
        """The voices of this encoder, oldest first."""
        self._sync()
        return sorted(
            (v for v in self._voices.values() if v.cloned.encoder == encoder), key=lambda v: v.created_at
        )

    def find(self, key: str, encoder: str) -> Voice | None:
        """By id, else by name (case-insensitive), among this encoder's voices."""
        if not key or not encoder:
            return None
        self._sync()
        voice = self._voices.get(key)
        if voice is not None and voice.cloned.encoder == encoder:
            return voice
        folded = key.strip().casefold()
        return next((v for v in self.voices(encoder) if v.name.casefold() == folded), None)

    def stream_params(self, voice: str, info: ModelInfo) -> StreamParams | None:
        """A stream's options for a stored voice, or None when ``voice`` is not one."""
        found = self.find(voice, info.voice_encoder)
        return None if found is None else StreamParams(extra={CLONED_VOICE_KEY: found.cloned})

    def __iter__(self) -> Iterator[Voice]:
        self._sync()
        return iter(list(self._voices.values()))

    # --- changes --------------------------------------------------------------------------------
    def owned_by(self, owner: str) -> int:
        """Voices of this owner, stored or being cloned."""
        self._sync()
        return sum(v.owner == owner for v in self._voices.values()) + self._pending_owners[owner]

    async def add(
        self,
        name: str,
        ref: ReferenceAudio,
        transcript: str,
        engine: Cloner,
        *,
        owner: str,
        limits: ReferenceLimits,
    ) -> tuple[Voice, bool]:
        """The voice of this reference (True: computed now; False: it was there, or being computed
        by a concurrent upload of the same reference). ``owner``: whose quota it counts against ("":
        nobody's). Raises VoiceError, and what ``clone_voice`` raises (CloningNotSupported,
        EngineNotReady, ValueError, RuntimeError)."""
        name = check_name(name)
        transcript = transcript.strip()
        if len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise VoiceError(
                400, "transcript_too_long", f"a transcript is limited to {MAX_TRANSCRIPT_CHARS} characters"
            )
        encoder = engine.info.voice_encoder
        vid = voice_id(encoder, ref, transcript)
        self._sync()
        existing = self._voices.get(vid)
        if existing is not None:
            return existing, False
        if vid in self._pending:
            return await asyncio.shield(self._pending[vid]), False
        taken = self.find(name, encoder)
        if taken is not None:
            raise VoiceError(
                409, "voice_name_taken", f"a voice named {taken.name!r} exists already ({taken.id})"
            )
        key = (encoder, name.casefold())
        if key in self._pending_names:  # another reference under this name is being cloned now
            raise VoiceError(409, "voice_name_taken", f"a voice named {name!r} is being created")
        self._check_room(owner, limits)
        future: asyncio.Future[Voice] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # waiters may be none
        self._pending[vid] = future
        self._pending_names.add(key)
        self._pending_owners[owner] += 1
        try:
            cloned = await engine.clone_voice(ref.pcm, ref.sample_rate_hz, transcript)
            if not cloned.finite:
                raise VoiceError(
                    422, "non_finite_voice", "the model derived NaN or infinite values from this clip"
                )
            voice = Voice(vid, name, cloned, ref.duration_s, ref.sample_rate_hz, time.time(), owner)
            if self.directory is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._write, voice)
            self._voices[vid] = voice
            future.set_result(voice)
        except BaseException as err:
            future.set_exception(err)
            raise
        finally:
            del self._pending[vid]
            self._pending_names.discard(key)
            self._pending_owners -= Counter({owner: 1})  # and forgotten at 0
        log.info("voice %s (%r) cloned from %.1f s of audio", vid, name, ref.duration_s)
        return voice, True

    def _check_room(self, owner: str, limits: ReferenceLimits) -> None:
        """The client's own quota first: what it can do something about."""
        quota = limits.max_voices_per_client
        if owner and quota and self.owned_by(owner) >= quota:
            raise VoiceError(
                429, "voice_quota_exceeded", f"a client keeps at most {quota} voices; delete one first"
            )
        if len(self._voices) + len(self._pending) >= limits.max_voices:
            raise VoiceError(507, "voice_store_full", f"the server keeps at most {limits.max_voices} voices")

    def delete(self, voice: Voice) -> None:
        self._voices.pop(voice.id, None)
        if self.directory is not None:
            for suffix in (".json", ".safetensors"):  # the manifest first: then it is gone for a reader
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / f"{voice.id}{suffix}").unlink()

    # --- disk -----------------------------------------------------------------------------------
    def _sync(self) -> None:
        """A shared store: what other processes added to or deleted from the directory since."""
        if not self.shared:
            return
        assert self.directory is not None
        try:
            mtime_ns = self.directory.stat().st_mtime_ns
        except FileNotFoundError:
            mtime_ns = 0
        if mtime_ns == self._seen_ns:
            return
        # a change in the same clock tick as this read would leave the mtime as it is: a directory
        # changed in the last second is read again next time
        self._seen_ns = mtime_ns if time.time_ns() - mtime_ns > 1_000_000_000 else -1
        on_disk = {m.name.removesuffix(".json"): m for m in self.directory.glob(f"{ID_PREFIX}*.json")}
        for gone in set(self._voices) - set(on_disk):
            del self._voices[gone]
        for vid, manifest in on_disk.items():
            if vid not in self._voices:
                try:
                    self._voices[vid] = self._read(manifest)
                except Exception as err:  # half written by another process, or broken: next time
                    log.debug("voice %s not read: %s", manifest.name, err)
                    self._seen_ns = -1

    def load(self) -> int:
        """Read every voice of the directory (at start); a broken one is skipped with a warning."""
        if self.directory is None or not self.directory.is_dir():
            return 0
        for manifest in sorted(self.directory.glob(f"{ID_PREFIX}*.json")):
            try:
                voice = self._read(manifest)
            except Exception as err:  # one bad file must not keep the server from starting
                log.warning("skipping voice %s: %s", manifest.name, err)
                continue
            self._voices[voice.id] = voice
        log.info("%d cloned voices loaded from %s", len(self._voices), self.directory)
        return len(self._voices)

    def _read(self, manifest: Path) -> Voice:
        from safetensors.numpy import load_file

        m = json.loads(manifest.read_text())
        if m.get("version") != MANIFEST_VERSION or f"{m['id']}.json" != manifest.name:
            raise ValueError("not a voice manifest of this version")
        arrays = load_file(str(manifest.with_name(f"{m['id']}.safetensors")))
        cloned = ClonedVoice(m["encoder"], dict(arrays), m.get("transcript", ""))
        if not cloned.finite:
            raise ValueError("its arrays hold NaN or infinite values")
        return Voice(
            m["id"],
            m["name"],
            cloned,
            float(m["duration_s"]),
            int(m["sample_rate_hz"]),
            float(m["created_at"]),
            str(m.get("owner", "")),
        )

    def _write(self, voice: Voice) -> None:
        from safetensors.numpy import save_file

        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        arrays = self.directory / f"{voice.id}.safetensors"
        save_file(voice.cloned.arrays, str(arrays) + ".tmp")
        os.replace(str(arrays) + ".tmp", arrays)
        manifest = {
            "version": MANIFEST_VERSION,
            "id": voice.id,
            "name": voice.name,
            "encoder": voice.cloned.encoder,
            "transcript": voice.cloned.ref_text,
            "duration_s": voice.duration_s,
            "sample_rate_hz": voice.sample_rate_hz,
            "created_at": voice.created_at,
            "owner": voice.owner,
            "arrays": {
                k: {"dtype": a.dtype.str, "shape": list(a.shape)} for k, a in voice.cloned.arrays.items()
            },
        }
        path = self.directory / f"{voice.id}.json"
        path.with_suffix(".json.tmp").write_text(json.dumps(manifest, indent=1))
        os.replace(path.with_suffix(".json.tmp"), path)


def default_voices_dir() -> Path:
    """``$XDG_DATA_HOME/voicewire/voices``, by default ``~/.local/share/voicewire/voices``."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "voicewire" / "voices"
