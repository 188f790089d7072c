"""Package boundaries from DESIGN.md, checked in a fresh interpreter."""

import subprocess
import sys

BLOCK_TRANSPORTS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'aiohttp', 'aiortc', 'av', 'websockets'} or name.startswith('voicewire.realtime'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""


TREE_PACKAGES = {"engine", "realtime", "kernels"}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_engine_imports_and_runs_without_transport_packages() -> None:
    code = (
        BLOCK_TRANSPORTS
        + """
import asyncio
import voicewire.engine.models.hibari_voice, voicewire.kernels
from voicewire import engine
async def main():
    eng = engine.Engine().start()
    s = eng.open_stream(seed=0); s.push_text('Hi.'); s.end()
    n = sum([c.pcm.size async for c in s])
    eng.close()
    assert n > 0
asyncio.run(main())
print('ok')
"""
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


def test_scheduler_and_text_feeder_need_no_torch() -> None:
    proc = _run(
        "import sys, voicewire.engine.scheduler, voicewire.engine.text_feeder; print('torch' in sys.modules)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_blocker_really_blocks() -> None:
    proc = _run(BLOCK_TRANSPORTS + "import voicewire.realtime.session")
    assert proc.returncode != 0 and "blocked" in proc.stderr


BLOCK_CLIENT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.startswith('voicewire.realtime.client'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""

def test_server_imports_nothing_from_the_client_side() -> None:
    """The gateway serves without the client library, the adapters or the probe (DESIGN.md): every
    module of realtime/ outside realtime/client/ (server, gateway, sessions, transports, CLI)."""
    from pathlib import Path

    realtime = Path(__file__).resolve().parents[1] / "realtime"
    modules = sorted(p.stem for p in realtime.glob("*.py") if p.stem != "__init__")
    assert {"server", "gateway", "session", "websocket", "webrtc", "http_api", "cli"} <= set(modules)
    code = BLOCK_CLIENT + "".join(f"import voicewire.realtime.{m}\n" for m in modules) + "print('ok')"
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    blocked = _run(BLOCK_CLIENT + "import voicewire.realtime.client.probe")
    assert blocked.returncode != 0 and "blocked" in blocked.stderr


def test_every_import_uses_the_installed_name() -> None:
    """The tree's folders install as voicewire.*; a bare `import engine` would work from the
    repo root and break in an installed wheel."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bare = []
    for folder in ("engine", "realtime", "kernels", "tests", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                bare += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in TREE_PACKAGES]
    assert not bare, bare
