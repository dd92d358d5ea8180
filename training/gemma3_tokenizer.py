"""A Gemma-style byte-fallback BPE tokenizer for any small vocabulary, built offline and deterministically.

The tokenizer of the embedded default model (training/tokenizer.py) and of the test suite's tiny random Gemma 3
checkpoints (tests/fixtures/tiny_gemma3_tokenizer.py) are both built here, each from its own text and number of
merges. No torch, no download: the merges are learned greedily from the given text.

Vocabulary layout (ids): first :data:`HEAD_SPECIAL_TOKENS` (0-6: ``<pad>``, ``<eos>``, ``<bos>``, ``<unk>``,
``<mask>``, ``<start_of_turn>``, ``<end_of_turn>``), then the 256 byte-fallback tokens ``<0x00>`` .. ``<0xFF>``,
the base characters :data:`BASE_CHARS` (``▁`` for a space, ``\\n``, printable ASCII), one token per learned merge,
and last :data:`TAIL_SPECIAL_TOKENS` (``<start_of_image>``, ``<end_of_image>``, ``<image_soft_token>``). As in
Gemma 3, the image soft token's id is the text vocabulary size.
"""

from __future__ import annotations

import re
from collections import Counter

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
MASK_TOKEN = "<mask>"
SOT_TOKEN = "<start_of_turn>"
EOT_TOKEN = "<end_of_turn>"
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"

HEAD_SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, MASK_TOKEN, SOT_TOKEN, EOT_TOKEN)
TAIL_SPECIAL_TOKENS = (BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN)
SPACE = "\u2581"  # "▁", what the Gemma normalizer turns a space into
BASE_CHARS = (SPACE, "\n") + tuple(chr(c) for c in range(33, 127))


def special_token_ids(num_merges: int) -> dict[str, int]:
    """Every special token -> its id in a vocabulary with ``num_merges`` merges (see the module docstring)."""
    first_merge_id = len(HEAD_SPECIAL_TOKENS) + 256 + len(BASE_CHARS)
    ids = {tok: i for i, tok in enumerate(HEAD_SPECIAL_TOKENS)}
    ids.update({tok: first_merge_id + num_merges + i for i, tok in enumerate(TAIL_SPECIAL_TOKENS)})
    return ids


def learn_merges(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Byte-pair merges learned greedily from ``text`` (ties broken by the pair's text, so fully deterministic).

    Words are a space marker plus the following characters, or runs of newlines; merges never cross words.
    """
    normalized = text.replace(" ", SPACE)
    chunks = re.findall(f"{SPACE}?[^{SPACE}\\n]+|\\n+|{SPACE}+", normalized)
    alphabet = set(BASE_CHARS)
    counts = Counter(c for c in chunks if all(ch in alphabet for ch in c))
    words = [(list(w), n) for w, n in sorted(counts.items())]
    known = set(BASE_CHARS)
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter = Counter()
        for symbols, n in words:
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += n
        candidates = [(-n, pair) for pair, n in pairs.items() if pair[0] + pair[1] not in known]
        if not candidates:
            raise ValueError("the text is too short for the requested number of merges")
        _, best = min(candidates)
        merges.append(best)
        merged = best[0] + best[1]
        known.add(merged)
        for symbols, _ in words:
            i = 0
            while i < len(symbols) - 1:
                if symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    symbols[i:i + 2] = [merged]
                i += 1
    return merges


def byte_fallback_vocab(text: str, num_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``(vocab, merges)`` of a Gemma-style byte-fallback BPE: ids 0-6 the head special tokens, then the 256 byte
    tokens, the base characters, one token per merge learned from ``text``, and last the image special tokens."""
    vocab: dict[str, int] = {}
    for tok in HEAD_SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in BASE_CHARS:
        vocab[ch] = len(vocab)
    merges = learn_merges(text, num_merges)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for tok in TAIL_SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    return vocab, merges


def gemma_bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A Gemma-style ``tokenizers.Tokenizer`` for ``vocab`` (which holds every Gemma 3 special token) and
    ``merges``: spaces -> ``▁``, BPE with byte fallback, ``<bos>`` prepended, the special tokens added."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=UNK_TOKEN, dropout=None,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos_id = vocab[BOS_TOKEN]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    specials = sorted(HEAD_SPECIAL_TOKENS + TAIL_SPECIAL_TOKENS, key=vocab.__getitem__)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok
