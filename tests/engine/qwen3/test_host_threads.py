"""torch's intra-op threads beside a Qwen3 model: one on CUDA (the host's ops there are small, and a
pool of spinning threads took the cores the worker and the gateway need), torch's own on the CPU,
and whatever ``OMP_NUM_THREADS`` says wherever it is set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from voicewire.engine.qwen3 import host_threads


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_cuda_model_leaves_one_intra_op_thread() -> None:
    host_threads(torch.device("cuda", 0))
    assert torch.get_num_threads() == 1


def test_a_cpu_model_keeps_torch_threads() -> None:
    host_threads(torch.device("cpu"))
    assert torch.get_num_threads() == 2


def test_omp_num_threads_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    host_threads(torch.device("cuda"))
    assert torch.get_num_threads() == 2
