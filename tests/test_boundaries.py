"""Package boundaries from DESIGN.md, checked in a fresh interpreter."""

import subprocess
import sys

BLOCK_TRANSPORTS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'aiohttp', 'aiortc', 'av', 'websockets', 'realtime'}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_engine_imports_and_runs_without_transport_packages() -> None:
    code = BLOCK_TRANSPORTS + """
import asyncio
import engine, engine.models.hibari_voice, kernels
async def main():
    eng = engine.Engine().start()
    s = eng.open_stream(seed=0); s.push_text('Hi.'); s.end()
    n = sum([c.pcm.size async for c in s])
    eng.close()
    assert n > 0
asyncio.run(main())
print('ok')
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


def test_scheduler_and_text_feeder_need_no_torch() -> None:
    proc = _run("import sys, engine.scheduler, engine.text_feeder; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_blocker_really_blocks() -> None:
    proc = _run(BLOCK_TRANSPORTS + "import realtime.session")
    assert proc.returncode != 0 and "blocked" in proc.stderr
