"""One client's share of the server (realtime/quotas.py): per-client sessions and speech requests,
the fair share of engine streams, and a second client that keeps speaking on time while one
client floods every endpoint at once (the flood in a process of its own: tests/gateway/flood.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys

import aiohttp
import pytest

from tests.conftest import running_gateway, wait_engine_idle
from tests.gateway.victim import VICTIM_ADDRESS, VICTIM_P95_MS, VICTIM_TEXT, victim_alongside, victim_ttfp_ms
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.client import Turn, VoicewireClient, VoicewireError
from voicewire.realtime.limits import ClientQuotas

HEAVY = "127.0.0.1"  # the heavy client's address
KEYS = ("quota-key-one-0123456789", "quota-key-two-0123456789")
LONG = " ".join(["A long reply keeps this stream busy for a good while."] * 6)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _connect(base: str, local: str = HEAVY, **options: object) -> VoicewireClient:
    return await VoicewireClient.connect(f"ws://{base}", local_addr=(local, 0), **options)  # type: ignore[arg-type]


async def _flood(base: str, *args: str) -> dict[str, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.gateway.flood",
        f"http://{base}",
        "--local-addr",
        HEAVY,
        *args,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0
    counts: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
    return counts


async def test_one_client_cannot_hold_every_session_and_keys_and_addresses_count_apart(
    engine: Engine,
) -> None:
    quotas = ClientQuotas(max_sessions=3)
    async with running_gateway(engine, quotas=quotas) as base:
        held = [await _connect(base) for _ in range(3)]
        with pytest.raises(VoicewireError) as refused:
            await _connect(base)
        assert refused.value.code == "quota_exceeded"
        other = await _connect(base, VICTIM_ADDRESS)  # another address is another client
        await held.pop().close()
        held.append(await _connect(base))  # a session given back is a session to take again
        for c in [*held, other]:
            await c.close()
        async with aiohttp.ClientSession() as http, http.get(f"http://{base}/metrics") as r:
            metrics = await r.text()
        assert 'voicewire_quota_refusals_total{quota="sessions"} 1.0' in metrics
    auth = AuthConfig(api_keys=KEYS)
    async with running_gateway(engine, quotas=quotas, auth=auth) as base:
        # with auth on a key is the client, wherever it connects from
        first = [await _connect(base, HEAVY if i % 2 else VICTIM_ADDRESS, api_key=KEYS[0]) for i in range(3)]
        with pytest.raises(VoicewireError) as refused:
            await _connect(base, VICTIM_ADDRESS, api_key=KEYS[0])
        assert refused.value.code == "quota_exceeded"
        second = await _connect(base, HEAVY, api_key=KEYS[1])
        for c in [*first, second]:
            await c.close()
    await wait_engine_idle(engine, 5)


async def test_speech_requests_per_client(engine: Engine) -> None:
    async with (
        running_gateway(engine, quotas=ClientQuotas(max_speech_requests=1)) as base,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(HEAVY, 0))) as heavy,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(VICTIM_ADDRESS, 0))) as other,
    ):
        url = f"http://{base}/v1/audio/speech"
        body = {"input": LONG, "response_format": "pcm"}
        async with heavy.post(url, json=body) as streaming:
            assert streaming.status == 200  # headers came with the first audio: it streams now
            async with heavy.post(url, json=body) as second:
                assert second.status == 429 and second.headers["Retry-After"] == "1"
                assert (await second.json())["error"]["code"] == "quota_exceeded"
            async with other.post(url, json={"input": VICTIM_TEXT}) as victim:
                assert victim.status == 200 and len(await victim.read()) > 10_000
            await streaming.read()
        async with heavy.post(url, json={"input": VICTIM_TEXT}) as again:
            assert again.status == 200  # the first one done: the quota is free again
            await again.read()
    await wait_engine_idle(engine, 5)


async def _open_turn(client: VoicewireClient) -> Turn:
    """A turn that holds its engine stream: text sent, no end (an LLM still streaming)."""
    turn = await client.start_turn()
    await turn.send(VICTIM_TEXT)
    return turn


async def test_a_heavy_client_gets_its_fair_share_of_streams_while_another_is_active() -> None:
    small = Engine(EngineConfig(model="hibari", max_streams=8, max_queued_streams=0)).start()
    try:
        async with running_gateway(small) as base:
            heavy = [await _connect(base) for _ in range(3)]
            # alone, one client may use every stream but the reserve (one of 8) for a newcomer
            alone = [await _open_turn(heavy[i % 3]) for i in range(8)]
            await asyncio.sleep(0.3)
            assert [bool(t.errors) for t in alone].count(True) == 1 and small.active_streams() == 7
            for t in alone:
                if not t.errors:
                    await t.cancel()
            await wait_engine_idle(small, 5)
            victim = await _connect(base, VICTIM_ADDRESS)
            # with another client active the heavy one holds at most half of the 8
            turns = [await _open_turn(heavy[i % 3]) for i in range(6)]
            await asyncio.sleep(0.3)
            # (which two: the sessions' messages reach the server in any order)
            codes = sorted(t.errors[0].code if t.errors else "" for t in turns)
            assert codes == [""] * 4 + ["share_exceeded"] * 2
            assert small.active_streams() == 4
            # ... and the newcomer's turn is admitted at once
            mine = victim.speak([VICTIM_TEXT])
            assert (await mine.done(timeout_s=20)).reason == "completed"
            admitted = next(i for i, t in enumerate(turns) if not t.errors)
            await turns[admitted].cancel()  # one of the heavy one's turns ends: it may open another
            again = await _open_turn(heavy[admitted % 3])
            await asyncio.sleep(0.3)
            assert not again.errors and small.active_streams() == 4
            for c in [*heavy, victim]:
                await c.close()
    finally:
        small.close()


async def test_a_second_client_speaks_on_time_while_one_floods_every_endpoint(engine: Engine) -> None:
    # The defaults: 64 sessions and 16 speech requests per client, the fair share of streams.
    async with running_gateway(engine) as base:
        assert await victim_ttfp_ms(base) < VICTIM_P95_MS  # warm
        gc.collect()
        rss0 = _rss_bytes()
        async with victim_alongside(base, min_turns=10):
            counts = await _flood(
                base, "--sessions", "300", "--speech", "100", "--uploads", "50", "--duration-s", "8"
            )
        assert counts["session:accepted"] == 64 and counts["session:quota_exceeded"] == 236, counts
        # 16 at once at most; whether any is admitted past the sessions' share of the streams depends
        # on which of them opened first
        refused_speech = counts.get("speech:quota_exceeded", 0) + counts.get("speech:share_exceeded", 0)
        assert refused_speech > 0, counts
        assert counts.get("upload:cloning_not_supported", 0) > 0, counts  # the embedded voice cannot clone
        await wait_engine_idle(engine, 30)
        gc.collect()
        assert _rss_bytes() < rss0 * 1.1 + 20e6, (rss0, _rss_bytes())


async def test_a_second_client_speaks_on_time_while_three_send_a_delta_every_millisecond(
    engine: Engine,
) -> None:
    async with running_gateway(engine) as base:
        async with victim_alongside(base, min_turns=10):
            args = [a for addr in ("127.0.0.3", "127.0.0.4", "127.0.0.5") for a in ("--deltas-from", addr)]
            counts = await _flood(base, *args, "--duration-s", "8")
        assert counts["deltas:session"] == 3 and counts["deltas:sent"] > 3_000, counts
        await wait_engine_idle(engine, 30)
