"""CUDA graphs of two pools replayed at once on two streams (the codec beside the frame step) give
what each gives alone (skipped without CUDA).

cuBLAS's split-K and stream-K kernels keep partial sums in the workspace, which torch keys by the
capture stream: graphs captured on one stream would share it and race when replayed together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from voicewire.engine.qwen3.cuda_graphs import CudaGraphs
from voicewire.engine.qwen3.host_staging import PinnedBlocks, Staging

pytestmark = pytest.mark.gpu

POOLS = ("main", "codec")


def _matmul_chain(a: Tensor, b: Tensor) -> Callable[[Tensor], Tensor]:
    """Few output tiles over a long K: the shape cuBLAS splits over K, through its workspace."""

    def body(inp: Tensor) -> Tensor:
        x = a * inp[0].to(a.dtype)
        acc = (x @ b).float()
        for _ in range(24):
            acc = acc + (x @ b).float()
        return acc

    return body


def concurrent_mismatches(graphs: CudaGraphs, rounds: int = 40) -> int:
    """Rounds in which a graph replayed beside the other differs from its replay alone."""
    dev = graphs.device
    one = np.ones(1, np.int64)
    alone = {p: graphs.run((p,), one).clone() for p in POOLS}
    torch.cuda.synchronize(dev)
    main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
    outs: list[tuple[Tensor, Tensor]] = []
    staging = Staging(PinnedBlocks(), dev)  # not released: nothing here is written twice
    for _ in range(rounds):
        side.wait_stream(main)
        with torch.cuda.stream(side):
            codec = graphs.run(("codec",), one, staging).clone()
        outs.append((graphs.run(("main",), one, staging).clone(), codec))
        main.wait_stream(side)
    torch.cuda.synchronize(dev)
    return sum(not (torch.equal(m, alone["main"]) and torch.equal(c, alone["codec"])) for m, c in outs)


def two_pools(dev: torch.device) -> CudaGraphs:
    gen = torch.Generator(device=dev).manual_seed(0)
    graphs = CudaGraphs(dev, enabled=True)
    for pool in POOLS:
        a = torch.randn(64, 1 << 15, device=dev, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(1 << 15, 64, device=dev, dtype=torch.bfloat16, generator=gen)
        graphs.add((pool,), _matmul_chain(a, b), torch.ones(1, dtype=torch.int64), pool=pool)
    graphs.capture()
    return graphs


def test_two_pools_replayed_at_once_give_what_each_gives_alone() -> None:
    graphs = two_pools(torch.device("cuda"))
    assert graphs.capture_stream("main") is not graphs.capture_stream("codec")
    assert concurrent_mismatches(graphs) == 0


def test_bodies_warmed_on_other_threads_are_captured_with_their_timed_convs() -> None:
    """torch keeps cuDNN's timed conv algorithms per thread: a body warmed on one thread and
    captured on another is timed again inside the capture, which invalidates it
    (cudaErrorStreamCaptureInvalidated). ``capture`` captures each body on the thread that warmed it."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    graphs = CudaGraphs(dev, enabled=True, warm_threads=2)
    bodies = {}
    for k in range(6):
        w = torch.randn(64, 64, 7, device=dev, generator=gen)

        def body(inp: Tensor, w: Tensor = w, length: int = 200 + 37 * k) -> Tensor:  # a shape of its own
            x = torch.ones(2, 64, length, device=dev) * inp[0].float()
            return torch.nn.functional.conv1d(x, w)

        bodies[k] = body
        graphs.add(("conv", k), body, torch.ones(1, dtype=torch.int64), warm_lane=f"codec-{k % 3}")
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        graphs.capture()
    finally:
        torch.backends.cudnn.benchmark = before
    two = np.full(1, 2, np.int64)
    for k, body in bodies.items():
        # the eager call takes cuDNN's heuristic algorithm on this thread, the graph the one timed on
        # its warming thread: the same conv up to the algorithm's rounding (~1e-5 relative seen)
        torch.testing.assert_close(
            graphs.run(("conv", k), two).clone(), body(torch.from_numpy(two).to(dev)), rtol=1e-4, atol=1e-3
        )
