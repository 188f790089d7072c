"""A grid-wide barrier for persistent kernels: every program of the launch waits until all have arrived.

Only for launches whose programs are all resident at once (at most one program per SM of the device:
the callers size their grids so). It cannot run in the CPU interpreter, which runs programs one after
another: callers there launch one phase per launch instead (the barrier falls on the launch boundary).

``counter_ptr`` is an int32 that starts the launch at 0 (the launch zeroes it again on exit, see
``grid_exit``); barrier ``i`` (1-based) of the launch waits for the counter to reach i * programs. The
arrival is a release at GPU scope after a CTA-wide barrier (everything the program stored before it is
visible to every program that sees the count), the wait an acquire; loads of data other programs wrote
use ``.cg`` (L2) so no stale L1 line is read.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grid_barrier(counter_ptr, target):
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def grid_exit(counter_ptr, exit_ptr, programs):
    """The last program out zeroes the barrier counter and the exit count for the next launch."""
    tl.debug_barrier()
    done = tl.atomic_add(exit_ptr, 1, sem="acq_rel", scope="gpu") + 1
    if done == programs:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(exit_ptr, 0, sem="relaxed", scope="gpu")
