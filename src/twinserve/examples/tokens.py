"""A streaming model: answers each prompt word by word, like a language model emitting tokens (no weights)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from pydantic import BaseModel, Field

from twinserve.model import Model

__all__ = ["Prompt", "Tokens"]

_TEXT = """
the model streams each word as soon as it is ready so a client sees the answer grow instead of waiting
for all of it and a client that leaves stops the work
"""
_WORDS = tuple(_TEXT.split())


class Prompt(BaseModel):
    """What to answer, and at most how many words."""

    text: str = Field(min_length=1, max_length=10_000)
    max_tokens: int = Field(16, ge=1, le=1024)


class Tokens(Model):
    """Yields one word per instance per step, chosen deterministically from the prompt; an instance whose answer
    is complete gets "" while the others go on."""

    name = "tokens"

    def predict(self, batch: list[Prompt]) -> Iterator[list[str]]:
        answers = [self._answer(prompt) for prompt in batch]
        for step in range(max(len(answer) for answer in answers)):
            yield [answer[step] if step < len(answer) else "" for answer in answers]

    @staticmethod
    def _answer(prompt: Prompt) -> list[str]:
        start = int.from_bytes(hashlib.sha256(prompt.text.encode()).digest()[:4], "big")
        return [_WORDS[(start + i) % len(_WORDS)] for i in range(prompt.max_tokens)]

    def examples(self) -> list[Prompt]:
        return [Prompt(text="Why stream?", max_tokens=8)]
