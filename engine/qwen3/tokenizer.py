"""Text -> token ids for the talker, incrementally.

Two tokenizers share one interface:

- :class:`Qwen2Tokenizer`: the checkpoint's Qwen2 byte-level BPE, built with the ``tokenizers``
  package from ``vocab.json`` + ``merges.txt`` (+ special tokens from ``tokenizer_config.json``),
  exactly as ``transformers`` converts it (NFC, the Qwen2 split regex, byte-level, BPE).
- :class:`StandInTokenizer`: for random weights (no files): the same split regex, one hashed id in
  the ordinary-token range per piece, and the real ids of the chat markers.

:class:`TextStream` turns complete words into token ids as they arrive. BPE never merges across
pieces of the split regex, so tokenizing a text piece by piece equals tokenizing it whole as long as
every cut falls on a piece boundary. Only the last piece of the text received so far can still
change (``"Hello "`` + ``"world"`` re-splits the trailing space into ``" world"``), so it is held back
until more text or the end arrives - unless it ends with a letter or digit: the engine hands over
complete words, so the next character is a space or punctuation and cannot extend it.
"""

from __future__ import annotations

import functools
import json
import os
import unicodedata
import zlib
from collections.abc import Sequence
from typing import Protocol

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .errors import CheckpointError

QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# transformers 4.57.3 swaps this in for any tokenizer of > 100k tokens loaded from a directory whose
# config.json was saved by 4.57.3 (or names no version) when asked to (the official package asks,
# ``fix_mistral_regex=True``). We follow it so our ids equal the official package's on the real
# checkpoints; see ``split_regex_for``.
MISTRAL_FIX_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Real Qwen2 ids, used by the stand-in tokenizer.
_QWEN2_IDS = {IM_START: 151_644, IM_END: 151_645, "assistant": 77091, "user": 872, "\n": 198}


class TextTokenizer(Protocol):
    def split(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        """Pieces of the split regex with their (start, end) offsets."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of a text whose ends fall on split-piece boundaries; special tokens are recognized."""
        ...

    @property
    def role_ids(self) -> list[int]:
        """``<|im_start|>assistant\\n``: the three ids that open the talker prompt."""
        ...

    def instruct_ids(self, instruct: str) -> list[int]:
        """``<|im_start|>user\\n{instruct}<|im_end|>\\n`` (the 1.7B CustomVoice instruction)."""
        ...


def _split_pretokenizer(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def split_regex_for(transformers_version: str, vocab_size: int) -> str:
    """The split regex the official package ends up with for a checkpoint (see MISTRAL_FIX_SPLIT)."""
    if vocab_size <= 100_000:
        return QWEN2_SPLIT
    ver = _version_tuple(transformers_version)
    if ver is not None and (ver <= (4, 57, 2) or ver >= (5, 0, 0)):
        return QWEN2_SPLIT
    return MISTRAL_FIX_SPLIT


def _version_tuple(v: str) -> tuple[int, ...] | None:
    parts: list[int] = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if parts else None


class Qwen2Tokenizer:
    """The checkpoint's byte-level BPE (``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``)."""

    def __init__(self, directory: str, transformers_version: str = "") -> None:
        vocab_path = os.path.join(directory, "vocab.json")
        merges_path = os.path.join(directory, "merges.txt")
        for path in (vocab_path, merges_path):
            if not os.path.isfile(path):
                raise CheckpointError(f"missing tokenizer file {path}")
        try:
            with open(vocab_path, encoding="utf-8") as f:
                vocab = json.load(f)
            merges = _read_merges(merges_path)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"unreadable tokenizer files in {directory}: {err}") from err
        split = split_regex_for(transformers_version, len(vocab))
        tok = Tokenizer(
            models.BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                unk_token=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                byte_fallback=False,
            )
        )
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [_split_pretokenizer(split), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
        specials = _special_tokens(os.path.join(directory, "tokenizer_config.json"))
        for content, idx in specials:
            if tok.token_to_id(content) is None:
                tok.add_special_tokens([content])
            if tok.token_to_id(content) != idx:
                raise CheckpointError(
                    f"tokenizer_config.json: special token {content!r} has id {idx}, but the "
                    f"vocabulary gives it {tok.token_to_id(content)} (ids must follow the vocabulary)"
                )
        self._tok = tok
        self._split = _split_pretokenizer(split)
        im_start = tok.token_to_id(IM_START)
        if im_start is None or tok.token_to_id(IM_END) is None:
            raise CheckpointError(f"{directory}: the tokenizer has no {IM_START} / {IM_END} special tokens")
        role = self.encode(f"{IM_START}assistant\n")
        tail = self.encode(f"{IM_END}\n{IM_START}assistant\n")
        if len(role) != 3 or len(tail) != 5:
            # The official prompt slices ids [:3] and [3:-5]; another split would misplace the text.
            raise CheckpointError(
                f"{directory}: '<|im_start|>assistant\\n' is not 3 tokens in this vocabulary"
            )
        self._role = role

    def split(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        return self._split.pre_tokenize_str(text)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    @property
    def role_ids(self) -> list[int]:
        return list(self._role)

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.encode(f"{IM_START}user\n{instruct}{IM_END}\n")


class StandInTokenizer:
    """Deterministic tokenizer for random weights: one id per split piece, real chat-marker ids."""

    FIRST_ID, SPAN = 1000, 150_000  # ordinary Qwen2 ids, below the special tokens at 151,643+

    def __init__(self) -> None:
        self._split = _split_pretokenizer(QWEN2_SPLIT)

    def split(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        return self._split.pre_tokenize_str(text)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, is_special in _cut_specials(text):
            if is_special:
                ids.append(_QWEN2_IDS[part])
            else:
                ids += [self._piece_id(p) for p, _ in self.split(unicodedata.normalize("NFC", part))]
        return ids

    def _piece_id(self, piece: str) -> int:
        if piece in ("\n", "assistant", "user"):
            return _QWEN2_IDS[piece]
        return self.FIRST_ID + zlib.crc32(piece.encode("utf-8")) % self.SPAN

    @property
    def role_ids(self) -> list[int]:
        return [_QWEN2_IDS[IM_START], _QWEN2_IDS["assistant"], _QWEN2_IDS["\n"]]

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.encode(f"{IM_START}user\n{instruct}{IM_END}\n")


class MemoTokenizer:
    """A tokenizer whose ``split`` and ``encode`` of short texts are remembered: streamed text comes
    a word or two a push, and the same words ("the", " and", ...) come back in every stream's text,
    each push splitting and encoding its words several times (TextStream, word timings). Both are
    pure, so a remembered answer is the answer; long texts (whole replies) are not kept."""

    def __init__(self, tokenizer: TextTokenizer, entries: int = 1 << 16, longest_chars: int = 48) -> None:
        self._tok = tokenizer
        self._longest = longest_chars
        self._split = functools.lru_cache(maxsize=entries)(tokenizer.split)
        self._encode = functools.lru_cache(maxsize=entries)(tokenizer.encode)

    def split(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        return self._split(text) if len(text) <= self._longest else self._tok.split(text)

    def encode(self, text: str) -> list[int]:
        """The ids (shared with later callers: not to be changed)."""
        return self._encode(text) if len(text) <= self._longest else self._tok.encode(text)

    @property
    def role_ids(self) -> list[int]:
        return self._tok.role_ids

    def instruct_ids(self, instruct: str) -> list[int]:
        return self._tok.instruct_ids(instruct)


class TextStream:
    """One stream's text: complete words in, token ids out as soon as they cannot change."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer
        self._pending = ""
        self.ids: list[int] = []
        self.final = False

    def push(self, pieces: Sequence[str], final: bool) -> None:
        if self.final:
            raise ValueError("text arrived after the end of the text")
        self._pending += "".join(pieces)
        self.final = final
        if not self._pending:
            return
        if final:
            cut = len(self._pending)
        else:
            parts = self._tok.split(self._pending)
            if not parts:
                return
            last, (last_start, last_end) = parts[-1]
            cut = last_end if last[-1:].isalnum() else last_start
        if cut > 0:
            self.ids += self._tok.encode(self._pending[:cut])
            self._pending = self._pending[cut:]

    @property
    def pending_text(self) -> str:
        return self._pending


def _cut_specials(text: str) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    rest = text
    while rest:
        hits = [(rest.find(s), s) for s in (IM_START, IM_END) if s in rest]
        if not hits:
            out.append((rest, False))
            break
        pos, tok = min(hits)
        if pos:
            out.append((rest[:pos], False))
        out.append((tok, True))
        rest = rest[pos + len(tok) :]
    return out


def _read_merges(path: str) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            a, _, b = line.partition(" ")
            if not b:
                raise ValueError(f"bad merges line {line!r}")
            merges.append((a, b))
    return merges


def _special_tokens(path: str) -> list[tuple[str, int]]:
    """(content, id) of the added tokens in tokenizer_config.json, by id."""
    if not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"unreadable {path}: {err}") from err
    added = cfg.get("added_tokens_decoder") or {}
    return sorted(((str(v["content"]), int(k)) for k, v in added.items()), key=lambda kv: kv[1])
