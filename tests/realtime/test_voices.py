"""The voice store on its own, with a cloner double that returns what it is told to: quotas (clones
under way counted), owners on disk (manifests from before owners load), voices that are not finite."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from tests.realtime.voice_clips import RATE_HZ, clip
from voicewire.engine import ClonedVoice, ModelInfo, TextGranularity
from voicewire.realtime.reference_audio import ReferenceAudio, ReferenceLimits
from voicewire.realtime.voices import VoiceError, VoiceStore, check_name

pytestmark = pytest.mark.shared_cores  # the voice store: nothing timed

ENCODER = "test-encoder"
INFO = ModelInfo("test", RATE_HZ, 1920, TextGranularity.WORD, 1, 1, ("default",), voice_encoder=ENCODER)


class Cloner:
    """Clones into the arrays it is given; ``gate``: each clone waits for it."""

    def __init__(self, xvector: np.ndarray | None = None, gate: asyncio.Event | None = None) -> None:
        self.xvector = np.ones(8, np.float32) if xvector is None else xvector
        self.gate = gate

    @property
    def info(self) -> ModelInfo:
        return INFO

    async def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str = "") -> ClonedVoice:
        if self.gate is not None:
            await self.gate.wait()
        return ClonedVoice(ENCODER, {"xvector": self.xvector, "codes": np.zeros((4, 16), np.int64)}, ref_text)


def ref(seed: int) -> ReferenceAudio:
    return ReferenceAudio(clip(1.5, seed=seed), RATE_HZ)


async def test_a_voice_that_is_not_finite_is_not_stored(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    for bad in (np.nan, np.inf):
        xvector = np.ones(8, np.float32)
        xvector[3] = bad
        with pytest.raises(VoiceError) as err:
            await store.add("Nan", ref(1), "", Cloner(xvector), owner="addr:a", limits=ReferenceLimits())
        assert (err.value.status, err.value.code) == (422, "non_finite_voice")
    assert list(store) == [] and list(tmp_path.iterdir()) == []
    assert store.owned_by("addr:a") == 0  # the refused clone holds no quota


async def test_a_voice_file_that_is_not_finite_is_skipped_at_start(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    store = VoiceStore(tmp_path)
    voice, _ = await store.add("Good", ref(1), "", Cloner(), owner="addr:a", limits=ReferenceLimits())
    save_file({"xvector": np.full(8, np.nan, np.float32)}, str(tmp_path / f"{voice.id}.safetensors"))
    assert VoiceStore(tmp_path).load() == 0


async def test_owners_are_stored_and_voices_from_before_owners_load(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    limits = ReferenceLimits(max_voices_per_client=1)
    mine, _ = await store.add("Mine", ref(1), "", Cloner(), owner="addr:a", limits=limits)
    old, _ = await store.add("Old", ref(2), "", Cloner(), owner="addr:b", limits=limits)
    manifest = tmp_path / f"{old.id}.json"
    m = json.loads(manifest.read_text())
    assert m["owner"] == "addr:b" and m["version"] == 1
    del m["owner"]  # as written before owners were kept
    manifest.write_text(json.dumps(m))
    loaded = VoiceStore(tmp_path)
    assert loaded.load() == 2
    assert loaded.find("Old", ENCODER).owner == "" and loaded.find("Mine", ENCODER).owner == "addr:a"  # type: ignore[union-attr]
    assert "owner" not in loaded.find("Mine", ENCODER).describe()  # type: ignore[union-attr]
    # a's quota is spent (restart or not); b's voice from before counts for nobody
    with pytest.raises(VoiceError) as err:
        await loaded.add("Mine too", ref(3), "", Cloner(), owner="addr:a", limits=limits)
    assert (err.value.status, err.value.code) == (429, "voice_quota_exceeded")
    await loaded.add("New b", ref(4), "", Cloner(), owner="addr:b", limits=limits)
    assert mine.id in {v.id for v in loaded}


async def test_clones_under_way_count_against_both_limits() -> None:
    store = VoiceStore()
    gate = asyncio.Event()
    limits = ReferenceLimits(max_voices_per_client=1, max_voices=2)
    first = asyncio.create_task(store.add("A1", ref(1), "", Cloner(gate=gate), owner="addr:a", limits=limits))
    await asyncio.sleep(0)  # A1 is being cloned
    with pytest.raises(VoiceError) as err:
        await store.add("A2", ref(2), "", Cloner(), owner="addr:a", limits=limits)
    assert err.value.code == "voice_quota_exceeded"
    second = asyncio.create_task(
        store.add("B1", ref(3), "", Cloner(gate=gate), owner="addr:b", limits=limits)
    )
    await asyncio.sleep(0)
    with pytest.raises(VoiceError) as err:
        await store.add("C1", ref(4), "", Cloner(), owner="addr:c", limits=limits)
    assert (err.value.status, err.value.code) == (507, "voice_store_full")
    # the same reference again is found, not refused: it adds nothing
    again = asyncio.create_task(store.add("A1", ref(1), "", Cloner(), owner="addr:a", limits=limits))
    gate.set()
    (a1, created), (_, _), (a1_again, found_created) = await asyncio.gather(first, second, again)
    assert created and a1_again.id == a1.id and not found_created
    assert len(list(store)) == 2


def test_a_name_that_reads_as_an_id_in_any_case_is_refused() -> None:
    for name in ("voice_0123", "VOICE_0123abcd", "Voice_x"):
        with pytest.raises(VoiceError) as err:
            check_name(name)
        assert err.value.code == "invalid_name"
    assert check_name("  my voice_1 ") == "my voice_1"


async def test_stores_sharing_a_directory_see_each_others_voices(tmp_path: Path) -> None:
    """Gateway processes on one port (``serve --workers``): a voice cloned through one is found,
    counted and listed by the others, and gone from them once deleted; an unshared store keeps what
    it loaded at start."""
    a, b = VoiceStore(tmp_path, shared=True), VoiceStore(tmp_path, shared=True)
    alone = VoiceStore(tmp_path)
    limits = ReferenceLimits(max_voices_per_client=1)
    assert b.find("Ana", ENCODER) is None  # read (empty) before the voice exists
    voice, _ = await a.add("Ana", ref(1), "", Cloner(), owner="addr:a", limits=limits)
    found = b.find("Ana", ENCODER)
    assert found is not None and found.id == voice.id and found.owner == "addr:a"
    assert [v.id for v in b.voices(ENCODER)] == [voice.id] and b.owned_by("addr:a") == 1
    with pytest.raises(VoiceError) as err:  # the client's quota holds across processes
        await b.add("Bo", ref(2), "", Cloner(), owner="addr:a", limits=limits)
    assert err.value.code == "voice_quota_exceeded"
    assert alone.find("Ana", ENCODER) is None
    a.delete(voice)
    assert b.find(voice.id, ENCODER) is None and list(b) == []
