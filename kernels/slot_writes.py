"""The host's writes between two frame steps, in one launch: opened slots' rows, text, the KV table.

    packed  int64, the sections one after another (o opened slots, n text ids, k text lengths, t
            table entries):
            (o, OPEN_COLUMNS)  each opened slot's row (kernels/reference.py: its sampling row and
                               flags, its text length; its repetition history, first-feed flag,
                               position and frame count are zeroed)
            (n,) (n,)          flat indices into text (N * W) and the ids written there
            (k,) (k,)          slots and their text lengths (slots not opened in this flush)
            (t,) (t,)          flat indices into the block table and the blocks written there
    rows    kernels/reference.py ``SlotRows``: where they go

As torch ops a step's writes are ~25 launches (a scatter or fill per row tensor, three copies, the
casts between): ~0.5-1 ms of host time in a new turn's first step, while a quiet device waits for
it (kernels/reference.py runs them so off CUDA). Here they are one copy (the caller's) and one
launch. Program p < o writes opened slot p's row; the programs after it take BLOCK entries of one
section each. No two programs write one place: a slot opened in this flush gets its text length in
its row, not in the lengths section.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import check_kernel_device
from voicewire.kernels.reference import OPEN_COLUMNS, SlotRows

BLOCK = 128  # entries of one section a program
VOCAB_BLOCK = 1024  # repetition-history entries zeroed at once


@triton.jit(do_not_specialize=["opens", "text", "lens", "table"])
def _slot_writes_kernel(
    packed_ptr,
    opens,
    text,
    lens,
    table,
    top_k_ptr,
    seed_ptr,
    greedy_ptr,
    eos_ptr,
    whole_ptr,
    temperature_ptr,
    top_p_ptr,
    penalty_ptr,
    seen_ptr,
    pending_ptr,
    position_ptr,
    frames_ptr,
    text_len_ptr,
    text_ptr,
    table_ptr,
    COLUMNS: tl.constexpr,
    VOCAB: tl.constexpr,
    BLOCK: tl.constexpr,
    VOCAB_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < opens:
        row = packed_ptr + pid * COLUMNS
        s = tl.load(row)
        tl.store(top_k_ptr + 2 * s, tl.load(row + 1))
        tl.store(top_k_ptr + 2 * s + 1, tl.load(row + 2))
        tl.store(seed_ptr + s, tl.load(row + 3))
        tl.store(greedy_ptr + 2 * s, tl.load(row + 4) != 0)
        tl.store(greedy_ptr + 2 * s + 1, tl.load(row + 5) != 0)
        tl.store(eos_ptr + s, tl.load(row + 6) != 0)
        tl.store(whole_ptr + s, tl.load(row + 7) != 0)
        tl.store(text_len_ptr + s, tl.load(row + 8))
        tl.store(temperature_ptr + 2 * s, tl.load(row + 9).to(tl.int32).to(tl.float32, bitcast=True))
        tl.store(temperature_ptr + 2 * s + 1, tl.load(row + 10).to(tl.int32).to(tl.float32, bitcast=True))
        tl.store(top_p_ptr + 2 * s, tl.load(row + 11).to(tl.int32).to(tl.float32, bitcast=True))
        tl.store(top_p_ptr + 2 * s + 1, tl.load(row + 12).to(tl.int32).to(tl.float32, bitcast=True))
        tl.store(penalty_ptr + s, tl.load(row + 13).to(tl.int32).to(tl.float32, bitcast=True))
        tl.store(pending_ptr + s, False)
        tl.store(position_ptr + s, 0)
        tl.store(frames_ptr + s, 0)
        for v0 in range(0, VOCAB, VOCAB_BLOCK):
            v = v0 + tl.arange(0, VOCAB_BLOCK)
            tl.store(seen_ptr + s * VOCAB + v, v < 0, mask=v < VOCAB)
    else:
        base = packed_ptr + opens * COLUMNS
        chunk = pid - opens
        text_chunks = tl.cdiv(text, BLOCK)
        len_chunks = tl.cdiv(lens, BLOCK)
        i = tl.arange(0, BLOCK)
        if chunk < text_chunks:
            i += chunk * BLOCK
            at = tl.load(base + i, mask=i < text)
            tl.store(text_ptr + at, tl.load(base + text + i, mask=i < text), mask=i < text)
        elif chunk < text_chunks + len_chunks:
            i += (chunk - text_chunks) * BLOCK
            base += 2 * text
            at = tl.load(base + i, mask=i < lens)
            tl.store(text_len_ptr + at, tl.load(base + lens + i, mask=i < lens), mask=i < lens)
        else:
            i += (chunk - text_chunks - len_chunks) * BLOCK
            base += 2 * text + 2 * lens
            at = tl.load(base + i, mask=i < table)
            tl.store(table_ptr + at, tl.load(base + table + i, mask=i < table).to(tl.int32), mask=i < table)


def check_slot_rows(rows: SlotRows) -> None:
    """Once, where the rows are made (each launch checks only ``packed``: it runs every step)."""
    device = rows.text.device
    check_kernel_device(device)
    for name, t in rows._asdict().items():
        if t.device != device or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous on {device}, got {t.device} strides {t.stride()}")
    if rows.table.dtype != torch.int32:
        raise TypeError(f"table must be int32, got {rows.table.dtype}")


def slot_writes(packed: torch.Tensor, opens: int, text: int, lens: int, table: int, rows: SlotRows) -> None:
    """Apply ``packed`` (the module docstring's layout, on the rows' device) to ``rows`` (checked by
    ``check_slot_rows``), queued."""
    want = OPEN_COLUMNS * opens + 2 * (text + lens + table)
    if packed.dtype != torch.int64 or packed.shape != (want,) or packed.device != rows.text.device:
        raise ValueError(
            f"packed must be int64 ({want},) on {rows.text.device}, got {packed.dtype} "
            f"{tuple(packed.shape)} on {packed.device}"
        )
    programs = opens + sum(triton.cdiv(n, BLOCK) for n in (text, lens, table))
    if not programs:
        return
    vocab = rows.seen.shape[1]
    _slot_writes_kernel[(programs,)](
        packed,
        opens,
        text,
        lens,
        table,
        *rows,
        COLUMNS=OPEN_COLUMNS,
        VOCAB=vocab,
        BLOCK=BLOCK,
        VOCAB_BLOCK=min(VOCAB_BLOCK, triton.next_power_of_2(vocab)),
    )
