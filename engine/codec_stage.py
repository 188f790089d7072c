"""Stage 2 as the worker drives it: the due chunks' decode begun on the model, and their audio handed
to their streams as it is done (in order per stream, codec_work.py). Where the model has an urgent
lane (``Model.urgent_decode``), the chunks of streams less than ``urgent_slack_s`` ahead of their
playback go there as a piece of their own, begun first."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .codec_work import CodecWork, Piece
from .model import Decoded, DecodeWork, Model, Queued


class CodecStage:
    def __init__(
        self,
        max_bulk: int,
        urgent_slack_s: float,
        emit: Callable[[list[tuple[DecodeWork, Decoded]]], None],
        failed: Callable[[list[DecodeWork], Exception], None],
    ) -> None:
        self.work = CodecWork(max_bulk, self._hand_out)
        self._urgent_slack_s = urgent_slack_s
        self._emit = emit  # a piece's chunks and their audio, to their streams (gone ones the callee skips)
        self._failed = failed  # a piece that failed to begin or to finish: its streams fail

    def begin(self, model: Model, due: list[DecodeWork]) -> None:
        """The due chunks' decode begun, in order behind the codec work begun before."""
        slack = self._urgent_slack_s
        if model.urgent_decode and slack > 0:
            urgent = [d for d in due if d.slack_s < slack]
            if urgent:
                self._begin_piece(model, urgent, urgent=True)
            due = [d for d in due if d.slack_s >= slack]
        if due:
            self._begin_piece(model, due, urgent=False)

    def _begin_piece(self, model: Model, due: list[DecodeWork], urgent: bool) -> None:
        work = [d for d in due if d.n_frames]
        try:
            finish = model.decode_start(work, urgent=urgent) if work else Queued.finished([])
        except Exception as err:
            self._failed(due, err)
            return
        self.work.add(Piece(due, finish, urgent))

    def _hand_out(self, piece: Piece) -> None:
        try:
            decoded = iter(piece.finish())
        except Exception as err:
            self._failed(piece.due, err)
            return
        self._emit([(d, next(decoded) if d.n_frames else Decoded(np.zeros(0, np.float32))) for d in piece.due])
