"""One file per concept, a few hundred lines at most (STYLE.md): a production file past
``MAX_LINES`` keeps more than one concern and wants splitting, as engine.py, session.py and
webrtc.py were, into rooms of their own below their users."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("engine", "kernels", "realtime", "web")
MAX_LINES = 450


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for folder in PRODUCTION
        for path in (ROOT / folder).rglob("*.py")
    }


def test_no_production_file_is_over_the_limit() -> None:
    over = {name: n for name, n in _sizes().items() if n > MAX_LINES}
    assert not over, f"split these by concept (at most {MAX_LINES} lines a file): {over}"


def test_the_sizes_are_read() -> None:
    """The checks above cannot pass by reading nothing."""
    sizes = _sizes()
    assert sizes["engine/engine.py"] > 100 and sizes["realtime/session.py"] > 100
