import asyncio, gc, sys, collections, time
sys.path.insert(0, '/work/main')
from voicewire.engine import Engine, EngineConfig
from tests.realtime.gateway import gateway

def census():
    gc.collect()
    objs = gc.get_objects()
    c = collections.Counter(type(o).__name__ for o in objs)
    return len(objs), c

async def main():
    engine = Engine(EngineConfig(model='hibari')).start()
    async with gateway(engine) as gw:
        base = gw.url
        n0, c0 = census()
        for batch in range(1):
            proc = await asyncio.create_subprocess_exec(sys.executable, '-m', 'voicewire.realtime.cli', 'probe', '--url', base,
                '--rate', '20', '--duration', '5', '--session-per-turn', '--clients', '8', '--tokens-per-s', '30', '--barge-in', '0.2',
                '--out', '/tmp/leak_probe.json', '--plot', '', stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(3.5)
            t=time.perf_counter(); nm, cm = census(); dt=time.perf_counter()-t
            live = len(gw.sessions)
            print(f'mid-load: {live} sessions, {engine.active_streams()} streams, tracked {nm} (+{nm-n0}) = {(nm-n0)/max(1,live):.0f}/session, collect {dt*1000:.1f} ms', flush=True)
            print('   ', (cm - c0).most_common(40), flush=True)
            await proc.wait()
            await asyncio.sleep(1.0)
            n, c = census()
            import json; s = json.load(open('/tmp/leak_probe.json'))['summary']
            print(f'batch {batch}: turns {s["turns"]}, tracked objects {n} (+{n-n0}), sessions {len(gw.sessions)}', flush=True)
            diff = c - c0
            print('   ', diff.most_common(15), flush=True)
            n0, c0 = n, c
    engine.close()

asyncio.run(main())
