import asyncio, sys, time
sys.path.insert(0, '/work/main')
from voicewire.engine import Engine, EngineConfig
from voicewire.realtime.config import GatewayConfig
from voicewire.realtime.server import create_app, make_runner
from aiohttp import web

async def main():
    engine = Engine(EngineConfig(model='hibari')).start()
    app = create_app(GatewayConfig(), engine=engine)
    runner = make_runner(app); await runner.setup()
    site = web.TCPSite(runner, '127.0.0.1', 18998); await site.start()
    before = set(sys.modules)
    from voicewire.realtime.client import VoicewireClient
    from tests.conftest import speak_turn
    client_mods = set(sys.modules) - before
    before = set(sys.modules)
    for i in range(3):
        t = time.perf_counter()
        c = await VoicewireClient.connect('http://127.0.0.1:18998')
        t1 = time.perf_counter()
        turn, audio = await speak_turn(c, 'Hello there, how are you today?', 30.0)
        await c.close()
        new = sorted(m for m in set(sys.modules) - before - client_mods if not m.startswith('voicewire.realtime.client'))
        print(f'session {i}: connect {1000*(t1-t):.1f} ms, new modules {len(new)}: {new[:40]}')
        before = set(sys.modules)
    import aiohttp
    async with aiohttp.ClientSession() as http:
        for i in range(2):
            t=time.perf_counter()
            async with http.post('http://127.0.0.1:18998/v1/audio/speech', json={'input': 'Hi there.'}) as r:
                await r.read()
            new = sorted(set(sys.modules) - before)
            print(f'speech {i}: {1000*(time.perf_counter()-t):.1f} ms, new modules {len(new)}: {new[:40]}')
            before = set(sys.modules)
    await runner.cleanup(); engine.close()
asyncio.run(main())
