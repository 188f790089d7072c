"""Kernel tests: on a machine without CUDA the kernels run in Triton's CPU interpreter.

TRITON_INTERPRET is read when a `@triton.jit` function is decorated, i.e. when a kernel module (here or
the benchmarks' sliding-window kernel) is first imported; this conftest runs before the test modules
import them. With CUDA present it stays unset: the CUDA cases then run compiled and the CPU cases skip.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.kernels.common import DEVICES  # after the env var: its skip reads TRITON_INTERPRET


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)
