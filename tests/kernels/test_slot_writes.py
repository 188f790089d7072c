"""The step's host writes in one launch (kernels/slot_writes.py) against the torch ops of the same
packed layout (kernels/reference.py), on rows a previous owner left dirty."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicewire.kernels.reference import OPEN_COLUMNS, SlotRows, slot_writes_reference
from voicewire.kernels.slot_writes import BLOCK, check_slot_rows, slot_writes

SLOTS, VOCAB, WIDTH, BLOCKS = 300, 1500, 40, 6  # vocab past one VOCAB_BLOCK, not a power of two


def dirty_rows(device: str, seed: int) -> SlotRows:
    g = torch.Generator().manual_seed(seed)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-5, 1000, shape, generator=g, dtype=torch.int64).to(device)

    def flags(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=g) < 0.5).to(device)

    def floats(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(device)

    return SlotRows(
        ints(SLOTS, 2), ints(SLOTS), flags(SLOTS, 2), flags(SLOTS), flags(SLOTS), floats(SLOTS, 2),
        floats(SLOTS, 2), floats(SLOTS), flags(SLOTS, VOCAB), flags(SLOTS), ints(SLOTS), ints(SLOTS),
        ints(SLOTS), ints(SLOTS, WIDTH), ints(SLOTS * BLOCKS).to(torch.int32),
    )  # fmt: skip


def packed_writes(opens: int, text: int, lens: int, table: int, seed: int) -> np.ndarray:
    """Distinct slots for the opens and the lengths, as a flush makes them; negative floats too
    (their bits are negative as int32)."""
    rng = np.random.default_rng(seed)
    slots = rng.permutation(SLOTS)
    rows = np.zeros((opens, OPEN_COLUMNS), np.int64)
    rows[:, 0] = slots[:opens]
    rows[:, 1:9] = rng.integers(0, 2**32, (opens, 8))
    rows[:, 4:8] = rng.integers(0, 2, (opens, 4))
    rows[:, 9:] = rng.normal(size=(opens, 5)).astype(np.float32).view(np.int32)
    return np.concatenate(
        [
            rows.reshape(-1),
            rng.permutation(SLOTS * WIDTH)[:text],
            rng.integers(0, 5000, text),
            slots[opens : opens + lens],
            rng.integers(0, WIDTH, lens),
            rng.permutation(SLOTS * BLOCKS)[:table],
            rng.integers(0, 2**31, table),
        ]
    ).astype(np.int64)


@pytest.mark.parametrize(
    "counts",
    [(1, 0, 0, 0), (0, 0, 0, 1), (3, 7, 2, 5), (0, BLOCK + 3, 1, 0), (70, 2 * BLOCK + 1, BLOCK + 1, BLOCK)],
    ids=["one-open", "one-block", "few", "text-only", "many"],
)
def test_one_launch_writes_what_the_torch_ops_write(device: str, counts: tuple[int, int, int, int]) -> None:
    want, got = dirty_rows("cpu", 1), dirty_rows(device, 1)
    check_slot_rows(got)
    packed = torch.from_numpy(packed_writes(*counts, seed=sum(counts)))
    slot_writes_reference(packed, *counts, want)
    slot_writes(packed.to(device), *counts, got)
    for name, w, g in zip(SlotRows._fields, want, got, strict=True):
        assert torch.equal(g.cpu(), w), name


def test_nothing_to_write_launches_nothing(device: str) -> None:
    rows = dirty_rows(device, 2)
    before = [t.clone() for t in rows]
    slot_writes(torch.empty(0, dtype=torch.int64, device=device), 0, 0, 0, 0, rows)
    assert all(torch.equal(a, b) for a, b in zip(before, rows, strict=True))


def test_loud_errors(device: str) -> None:
    rows = dirty_rows(device, 3)
    with pytest.raises(ValueError, match="int64"):
        slot_writes(torch.zeros(OPEN_COLUMNS + 1, dtype=torch.int64, device=device), 1, 0, 0, 0, rows)
    with pytest.raises(TypeError, match="int32"):
        check_slot_rows(rows._replace(table=rows.table.long()))
    with pytest.raises(ValueError, match="contiguous"):
        check_slot_rows(rows._replace(top_k=rows.top_k.T))
