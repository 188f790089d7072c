"""Checks shared by the kernel launchers: where a Triton kernel can run, and loud errors when it cannot."""

from __future__ import annotations

import os

import torch

# Shared by the kernels: tl.dot needs every matmul dimension >= 16; what the launchers accept;
# log2(e), for softmax in base 2 (exp2 is one instruction).
MIN_DOT_DIM = 16
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LOG2_E = 1.4426950408889634
# The CPU interpreter runs programs one after another, each vectorised by numpy: few wide programs.
INTERPRETER_BLOCK_N = 512


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 set before import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_kernel_device(device: torch.device) -> None:
    """Raise for tensors that no Triton backend here can run."""
    if device.type == "cuda":
        return
    if device.type == "cpu" and interpreter_enabled():
        return
    raise ValueError(
        f"Triton kernels need CUDA tensors (got {device}); CPU tensors run only under the interpreter, "
        "with TRITON_INTERPRET=1 set before triton is first imported"
    )


def check_same_device_unit_stride(tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    """Every tensor on `device` with a contiguous last dimension (the kernels vectorise along it)."""
    for name, tensor in tensors.items():
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device}, expected {device}")
        if tensor.stride(-1) != 1 and tensor.shape[-1] > 1:  # a size-1 dim's stride is never used
            raise ValueError(
                f"{name} must have stride 1 in its last dimension, got strides {tensor.stride()}"
            )
    check_kernel_device(device)


def check_index(name: str, index: torch.Tensor, batch: int) -> None:
    """Per-row metadata (slots, lengths, positions) is int32 (B,): what the kernels load."""
    if index.dtype != torch.int32 or index.shape != (batch,):
        raise TypeError(f"{name} must be int32 of shape ({batch},), got {index.dtype} {tuple(index.shape)}")


def check_values_in_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """low <= values <= high, read on the host: a device->host sync, for tests and debugging only."""
    if values.numel() and (int(values.min()) < low or int(values.max()) > high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {values.tolist()}")
