"""Text <-> token ids for `costline engine serve`.

The engine's models have no real tokenizer: the Llama shapes carry seeded random weights, and the
trained byte-level pair (benchmarks/spec_decode/train_pair.py) reads bytes. The server needs text
anyway, because OpenAI clients and load generators send and count text:

- `ByteTokenizer` (the byte-level models, vocab 288): token = byte + 16 (FIRST_CONTENT_TOKEN_ID),
  as the pair was trained; decoding is incremental UTF-8, so a character split over tokens is
  emitted once whole.
- `WordTokenizer` (every other model, random weights): one token per whitespace-separated word,
  the id a hash of the word (xxhash64 mod the content vocabulary). A prompt of N words is N
  tokens, which is what a load generator that writes N-word prompts asks for. A generated token
  decodes to the word `" t<id>"`, so the text of k generated tokens is k words and re-encodes to
  k tokens: a client that counts tokens by words (or reads `usage`) gets the engine's count.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

import xxhash

from engine.core.request import FIRST_CONTENT_TOKEN_ID

BYTE_VOCAB_SIZE = FIRST_CONTENT_TOKEN_ID + 256  # the byte pair pads this to 288


class ByteTokenizer:
    name = "byte"

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < BYTE_VOCAB_SIZE:
            raise ValueError(f"the byte tokenizer needs a vocabulary of >= {BYTE_VOCAB_SIZE} ids, the model has "
                             f"{vocab_size}; use --tokenizer word")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b + FIRST_CONTENT_TOKEN_ID for b in text.encode()]

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    def token_bytes(self, token_id: int) -> bytes:
        b = token_id - FIRST_CONTENT_TOKEN_ID
        return bytes([b]) if 0 <= b < 256 else b""  # special and padding ids print nothing


class WordTokenizer:
    name = "word"

    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= FIRST_CONTENT_TOKEN_ID:
            raise ValueError(f"vocab_size must exceed {FIRST_CONTENT_TOKEN_ID}, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        span = self.vocab_size - FIRST_CONTENT_TOKEN_ID
        return [xxhash.xxh64_intdigest(w.encode()) % span + FIRST_CONTENT_TOKEN_ID for w in text.split()]

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)

    def token_bytes(self, token_id: int) -> bytes:
        return f" t{token_id}".encode()


Tokenizer = ByteTokenizer | WordTokenizer


@dataclass
class IncrementalDecoder:
    """Generated tokens -> text, token by token (UTF-8 pieces held until whole)."""

    tokenizer: Tokenizer
    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def feed(self, token_ids: list[int]) -> str:
        if isinstance(self.tokenizer, WordTokenizer):  # ASCII words: no UTF-8 state to carry
            return "".join([f" t{t}" for t in token_ids])
        tb = self.tokenizer.token_bytes
        return self._utf8.decode(b"".join(tb(t) for t in token_ids))


def tokenizer_for(kind: str, model_name: str, vocab_size: int) -> Tokenizer:
    """`kind`: "byte", "word" or "auto" (byte for the byte-level models, else word)."""
    if kind == "auto":
        kind = "byte" if model_name.startswith("byte-lm") or vocab_size == 288 else "word"
    if kind == "byte":
        return ByteTokenizer(vocab_size)
    if kind == "word":
        return WordTokenizer(vocab_size)
    raise ValueError(f"--tokenizer {kind!r}: use auto, byte or word")


def chat_prompt(messages: list[dict]) -> str:
    """The chat template: one `role: content` line per message, then `assistant:` (the word
    tokenizer counts each role as one token, so a client's token budget is off by 1 + one per message)."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])
