"""A simulated LLM reply: how the probe, the benchmarks and the tests send a turn's text.

After the LLM's own time to first token, the reply comes one token per ``text.delta`` at
``tokens_per_s`` (a token is a word with its trailing space here), or whole in one delta, then
``text.end``.
"""

from __future__ import annotations

import asyncio
import re

from .protocol import Turn

TEXTS = (
    "Sure, I can help you with that right away.",
    "Your appointment is confirmed for Tuesday at ten in the morning.",
    "The package left our warehouse yesterday and should arrive soon.",
    "Could you please repeat the last four digits of your card?",
    "Thanks for waiting. I have found the information you asked for, and I sent it to your inbox.",
    "Let me check the schedule and get back to you in a moment.",
    "Your order shipped this morning, and the tracking number is on its way to your email.",
)


def tokens_of(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


async def send_reply(
    turn: Turn,
    text: str,
    tokens_per_s: float | None,
    first_token_delay_s: float = 0.0,
    end: bool = True,
) -> None:
    """Send ``text`` as an LLM would stream it (``tokens_per_s`` None: whole, in one delta), then
    ``text.end`` unless ``end`` is False."""
    if first_token_delay_s > 0:
        await asyncio.sleep(first_token_delay_s)
    if tokens_per_s is None:
        await turn.send(text)
    else:
        for i, tok in enumerate(tokens_of(text)):
            if i:
                await asyncio.sleep(1.0 / tokens_per_s)
            await turn.send(tok)
    if end:
        await turn.end()
