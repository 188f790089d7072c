"""What a session keeps of its finished turns: their ids, to refuse late text for them, and the
spoken records of the last few, to answer a late ``turn.cancel`` with ``played_ms``."""

from __future__ import annotations

from collections import deque

from .protocol import TurnId
from .truncation import SpokenRecord

MAX_REMEMBERED_TURNS = 256  # finished turn ids kept to reject late text for them
# Finished turns whose words are kept for a late ``turn.cancel`` with ``played_ms``: the listener
# still hears the last one or two while the LLM's next replies queue behind them.
MAX_TRUNCATABLE_TURNS = 4


class FinishedTurns:
    def __init__(self) -> None:
        self._ids: deque[TurnId] = deque()
        self._id_set: set[TurnId] = set()
        self._spoken: dict[TurnId, SpokenRecord] = {}  # the last finished turns, oldest first

    def __contains__(self, turn_id: TurnId) -> bool:
        return turn_id in self._id_set

    def add(self, turn_id: TurnId) -> None:
        self._ids.append(turn_id)
        self._id_set.add(turn_id)
        if len(self._ids) > MAX_REMEMBERED_TURNS:
            self._id_set.discard(self._ids.popleft())

    def keep_spoken(self, turn_id: TurnId, record: SpokenRecord) -> None:
        self._spoken[turn_id] = record
        if len(self._spoken) > MAX_TRUNCATABLE_TURNS:
            del self._spoken[next(iter(self._spoken))]

    def spoken(self, turn_id: TurnId) -> SpokenRecord | None:
        return self._spoken.get(turn_id)
