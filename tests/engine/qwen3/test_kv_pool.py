"""The KV block allocator (kv_pool.py, no torch) and its device table (kv_cache.py): blocks taken as a
slot grows, all returned at release, never handed out twice, the scratch block never handed out, and
the table's changes going to the device in the step's one copy."""

from __future__ import annotations

import numpy as np
import pytest

from voicewire.engine.qwen3.kv_pool import PAGE, SCRATCH_BLOCK, KVPool, blocks_for


def held(pool: KVPool, slots: int) -> list[int]:
    return [int(b) for s in range(slots) for b in pool.table[s, : pool.owned(s)]]


def test_ensure_takes_blocks_as_a_slot_grows_and_release_returns_them_all() -> None:
    pool = KVPool(num_blocks=10, max_slots=3, max_positions=4 * PAGE)
    assert pool.free_blocks == pool.usable_blocks == 9
    assert pool.ensure(0, 1) and pool.owned(0) == 1
    assert pool.ensure(0, PAGE) and pool.owned(0) == 1  # still the first page
    assert pool.ensure(0, PAGE + 1) and pool.owned(0) == 2  # one past: a second block
    assert pool.ensure(1, 3 * PAGE) and pool.owned(1) == 3
    assert pool.ensure(0, 0) and pool.owned(0) == 2  # nothing to take
    taken = held(pool, 3)
    assert len(set(taken)) == 5 and SCRATCH_BLOCK not in taken and pool.free_blocks == 4
    assert (pool.table[2] == SCRATCH_BLOCK).all() and (pool.table[3] == SCRATCH_BLOCK).all()  # + pad row
    pool.release(0)
    assert pool.owned(0) == 0 and (pool.table[0] == SCRATCH_BLOCK).all() and pool.free_blocks == 6
    pool.release(0)  # released twice: nothing returned twice
    assert pool.free_blocks == 6
    pool.release(1)
    assert pool.free_blocks == 9 and sorted(pool._free) == list(range(1, 10))


def test_a_full_pool_refuses_without_taking_anything() -> None:
    pool = KVPool(num_blocks=4, max_slots=2, max_positions=8 * PAGE)
    assert pool.ensure(0, 2 * PAGE)
    assert not pool.ensure(1, 2 * PAGE)  # one block left, two asked: none taken
    assert pool.owned(1) == 0 and pool.free_blocks == 1
    assert pool.ensure(1, PAGE)
    assert not pool.ensure(0, 2 * PAGE + 1)
    pool.release(1)
    assert pool.ensure(0, 2 * PAGE + 1) and pool.owned(0) == 3


def test_blocks_are_never_shared_through_random_opens_and_closes() -> None:
    rng = np.random.default_rng(0)
    pool = KVPool(num_blocks=40, max_slots=8, max_positions=6 * PAGE)
    lengths = [0] * 8
    for _ in range(2000):
        s = int(rng.integers(8))
        if rng.random() < 0.2:
            pool.release(s)
            lengths[s] = 0
        else:
            n = min(lengths[s] + int(rng.integers(1, 80)), 6 * PAGE)
            if pool.ensure(s, n):
                lengths[s] = n
        taken = held(pool, 8)
        assert len(taken) == len(set(taken)) and SCRATCH_BLOCK not in taken
        assert len(taken) + pool.free_blocks == pool.usable_blocks
        assert all(pool.owned(i) == blocks_for(lengths[i]) for i in range(8))


def test_writes_collect_until_taken_and_past_the_row_is_a_bug() -> None:
    pool = KVPool(num_blocks=8, max_slots=2, max_positions=2 * PAGE)
    assert pool.take_writes() is None
    pool.ensure(1, PAGE + 1)
    pool.release(1)
    pool.ensure(0, 1)
    writes = pool.take_writes()
    assert writes is not None
    at, blocks = writes
    width = pool.max_blocks_per_slot
    mirror = np.full_like(pool.table, SCRATCH_BLOCK).reshape(-1)
    mirror[at] = blocks  # the device copy's scatter
    assert (mirror.reshape(pool.table.shape) == pool.table).all()
    assert set(at.tolist()) == {width, width + 1, 0} and pool.take_writes() is None
    with pytest.raises(ValueError, match="blocks"):
        pool.ensure(0, 2 * PAGE + 1)


def test_the_tables_changes_go_up_in_the_steps_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from voicewire.engine.qwen3.host_staging import Staging
    from voicewire.engine.qwen3.kv_cache import PagedKVCache
    from voicewire.engine.qwen3.slot_state import SlotState

    cpu = torch.device("cpu")
    cache = PagedKVCache(2, 8, 4, 2, 3 * PAGE, 16, torch.float32, cpu)
    state = SlotState(4, 16, 32, 3 * PAGE, 8, torch.float32, cpu, cache.block_table.view(-1))
    copies: list[int] = []
    put = Staging.put
    monkeypatch.setattr(Staging, "put", lambda self, v, *a: copies.append(len(v)) or put(self, v, *a))

    def step() -> None:
        state.flush(Staging(None, cpu), cache.pool.take_writes())

    assert not cache.grow({0: 1, 1: 2 * PAGE + 1, 3: PAGE})  # three slots, five blocks: one copy
    step()
    assert copies == [10]
    cache.pool.release(1)
    cache.grow({2: 1})
    step()
    assert copies == [10, 8]  # three entries back to scratch, one new
    assert torch.equal(cache.block_table, torch.from_numpy(cache.pool.table))
    assert not cache.grow({0: 1})
    step()
    assert copies == [10, 8]  # nothing changed: no copy
    full = cache.grow({3: 3 * PAGE, 0: 3 * PAGE, 2: 3 * PAGE})  # 7 usable, 3 held: room for two
    assert list(full) == [2] and "KV cache full" in full[2] and cache.pool.owned(2) == 1
    room = cache.room()
    assert (room.free_blocks, room.total_blocks, room.block_positions) == (0, 7, PAGE)
    assert room.new_stream_blocks == 2


# --- the pool sized from free memory (options.py) ------------------------------------------------------
GIB = 1 << 30


def test_pool_from_memory_on_fake_devices() -> None:
    from voicewire.engine.qwen3.options import (
        AUTO_MAX_SLOTS,
        HEADROOM_FRACTION,
        block_bytes,
        pool_from_memory,
        slot_bytes,
    )

    per_slot = slot_bytes(max_seq_len=1536, codec_state_width=400_000, codec_elem_bytes=2, talker_vocab=3072)
    per_block = block_bytes(num_layers=28, kv_heads=8, head_dim=128, elem_bytes=2)
    assert per_block == 7 << 20  # the 1.7B talker in bf16: 7 MiB a block
    assert per_slot.total < 1 << 20  # the codec's state row and the text / sampling rows, no KV
    # an H200 with the 1.7B's 4.5 GiB of weights held: the slots hit the cap, the blocks take the rest
    pool = pool_from_memory(134 * GIB, 139 * GIB, per_slot, per_block, own_bytes=int(4.5 * GIB))
    budget = int(134 * GIB - HEADROOM_FRACTION * 139 * GIB)
    used = (pool.slots + 1) * per_slot.total + pool.blocks * per_block
    assert pool.slots == AUTO_MAX_SLOTS == 2048
    assert used <= budget < used + per_block
    assert pool.blocks * PAGE > 1_000_000  # a million positions: ~500 streams of 2 minutes, or 2048 of 40 s
    # two cores on one H200: each budgets half of it, whichever loaded first
    half = pool_from_memory(134 * GIB, 139 * GIB, per_slot, per_block, own_bytes=int(4.5 * GIB), share=0.5)
    later = pool_from_memory(100 * GIB, 139 * GIB, per_slot, per_block, own_bytes=int(4.5 * GIB), share=0.5)
    assert half == later and half.blocks < pool.blocks // 2
    # a small card: every slot can still get going (its state and two blocks)
    small = pool_from_memory(6 * GIB + 100 * per_block, 8 * GIB, per_slot, per_block, cap=10**6)
    assert small.slots > 0 and small.blocks >= 2 * small.slots
    assert pool_from_memory(5 * GIB, 8 * GIB, per_slot, per_block).slots == 0  # not one: load_qwen3 says so
    with pytest.raises(ValueError):
        pool_from_memory(GIB, GIB, per_slot, per_block, share=0.0)
