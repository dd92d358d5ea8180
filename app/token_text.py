"""One token's own text and bytes, as log-probability answers show each token (OpenAI's ``token`` and ``bytes``).

A token's bytes are what it adds to the answer's UTF-8 text: a byte-fallback token ``<0xE2>`` adds that byte; a
byte-level BPE token (Qwen3-Omni, Llama 4: ``ByteLevel`` decoders) maps each of its characters back to the byte it
stands for; any other token is its piece with SentencePiece's ``▁`` as a space. A special token (``<eos>``,
``<end_of_turn>``) is its own name, though the answer's text leaves it out (``adds_text`` says which do). ``text``
is the bytes as UTF-8, or, for a token holding part of a character, ``bytes:\\xe2\\x80`` as OpenAI writes those.
"""

from __future__ import annotations

import codecs
import functools
import re

from omnijax.preprocess.tokenizer import byte_fallback_ids, special_tokens

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class TokenText:
    """``bytes_of(id)``, ``text_of(id)`` and ``adds_text(id)`` for the tokens of a transformers ``tokenizer``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = backend is not None and "ByteLevel" in repr(backend.decoder)
        self.byte_ids = byte_fallback_ids(tokenizer)
        self.special = frozenset(special_tokens(tokenizer).values())
        self._bytes: dict[int, bytes] = {}

    def piece(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` ("" for an id past the tokenizer's vocabulary: a padded row)."""
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        return piece if isinstance(piece, str) else ""

    def bytes_of(self, token_id: int) -> bytes:
        token_id = int(token_id)
        out = self._bytes.get(token_id)
        if out is None:
            piece = self.piece(token_id)
            match = _BYTE_TOKEN.fullmatch(piece) if token_id in self.byte_ids else None
            if match:
                out = bytes([int(match.group(1), 16)])
            elif self.byte_level and token_id not in self.special:
                table = _byte_level_decoder()
                out = bytes(table[c] for c in piece if c in table) if all(c in table for c in piece) \
                    else piece.encode()
            else:
                out = piece.replace("\u2581", " ").encode()
            self._bytes[token_id] = out
        return out

    def text_of(self, token_id: int) -> str:
        data = self.bytes_of(token_id)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)

    def adds_text(self, token_id: int) -> bool:
        """Whether the token's bytes are part of the answer's text (special tokens are not)."""
        return int(token_id) not in self.special


class TextOffsets:
    """Where each token starts in a text (in characters): ``push(id)`` -> the offset of that token, then moves past
    its bytes (a character split over several tokens counts once, at the token that completes it)."""

    def __init__(self, token_text: TokenText, start: int = 0):
        self.token_text = token_text
        self.offset = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> int:
        at = self.offset
        if self.token_text.adds_text(token_id):
            self.offset += len(self._decoder.decode(self.token_text.bytes_of(token_id)))
        return at
