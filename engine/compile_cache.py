"""Compiled kernels kept across starts: Triton's JIT output and inductor's compiled graphs in one
directory, so a second start of a server loads what the first one compiled.

A Qwen3-TTS start compiles hundreds of Triton kernel variants (every fused linear, attention and
codec kernel at the shapes of every graph bucket) and a few inductor graphs before its graphs can be
captured; from a warm cache each is a file read. The directory is per user and survives the process
(``$XDG_CACHE_HOME/voicewire``, else ``~/.cache/voicewire``); both libraries key their entries by
source, compiler version and device, so one directory serves every version and GPU. An operator's
own ``TRITON_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR`` win. cuDNN's conv timings live only in the
process: those are run again at every start.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR"}


@dataclass(frozen=True)
class CacheReport:
    directory: str
    entries: dict[str, int]  # library -> cached files found at start (0: this start compiles them)

    @property
    def warm(self) -> bool:
        return any(self.entries.values())


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "voicewire")


def use(directory: str | None = None) -> CacheReport:
    """Point both compilers at ``directory`` (None: the default) unless the environment already
    does, before anything compiles; logs what an earlier start left there."""
    root = Path(directory or default_dir()).expanduser()
    entries: dict[str, int] = {}
    for lib, var in ENV.items():
        path = Path(os.environ.setdefault(var, str(root / lib)))
        path.mkdir(parents=True, exist_ok=True)
        entries[lib] = sum(1 for p in path.rglob("*") if p.is_file())
    report = CacheReport(str(root), entries)
    if report.warm:
        log.info(
            "compile cache %s: %s from an earlier start, loaded instead of compiled",
            root,
            ", ".join(f"{n} {lib} files" for lib, n in entries.items()),
        )
    else:
        log.info("compile cache %s is empty: this start compiles its kernels, the next one loads them", root)
    return report
