"""Errors of the Qwen3-TTS package."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint directory is missing a file or tensor, or holds one that does not fit the config.

    The message names the file (and tensor) at fault, so a user pointing ``--checkpoint`` at the
    wrong directory learns what is wrong without reading a traceback.
    """
