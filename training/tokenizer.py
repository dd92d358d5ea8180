"""The embedded default model's tokenizer: a Gemma-style byte-fallback BPE over the words of its questions and
answers, built deterministically (no torch, no download).

Vocabulary layout (ids): 0-6 ``<pad>``, ``<eos>``, ``<bos>``, ``<unk>``, ``<mask>``, ``<start_of_turn>``,
``<end_of_turn>``; then the 256 byte-fallback tokens; the base characters (``▁`` for a space, ``\\n``, printable
ASCII); the merges learned from :func:`corpus` (every word of the templates ends up one token, most with their
punctuation); and last ``<start_of_image>``, ``<end_of_image>``, ``<image_soft_token>``. As in Gemma 3 the image
soft token's id is the text vocabulary size. Any other text still tokenizes (characters, then bytes).
"""

from __future__ import annotations

import functools

from training import dialogues as sd
from training.scenes import BACKGROUNDS, COLOURS, KINDS
from training.gemma3_tokenizer import HEAD_SPECIAL_TOKENS, TAIL_SPECIAL_TOKENS, byte_fallback_vocab, gemma_bpe_tokenizer

NUM_MERGES = 436  # every pair the corpus can still merge: each template word is one token


def corpus() -> str:
    """Every question and answer template of training/dialogues.py with every colour, kind, number and
    background filled in, one per line, in a fixed order."""
    lines = list(sd.DESCRIBE_PROMPTS + sd.DESCRIBE_MANY_PROMPTS + sd.COUNT_PROMPTS + sd.BACKGROUND_PROMPTS
                 + sd.COMPARE_PROMPTS + sd.TEXT_ONLY_PROMPTS + sd.SYSTEM_PROMPTS)
    for kind in KINDS:
        lines += [p.format(kind=kind) for p in sd.COLOUR_PROMPTS + sd.PRESENCE_PROMPTS]
        lines += [f"There is no {kind}.", f"No, there is no {kind}.", f"Yes, there are 2 {kind}s.",
                  f"Yes, there are 3 {kind}s."]
        for colour in COLOURS:
            article = "An" if colour[0] in "aeiou" else "A"
            lines += [f"{article} {colour} {kind}, {article.lower()} {colour} {kind}, two {colour} {kind}s and "
                      f"three {colour} {kind}s.",
                      f"The {kind} is {colour}.", f"The {kind}s are both {colour}.", f"The {kind}s are all {colour}.",
                      f"Yes, there is {article.lower()} {colour} {kind}.",
                      f"The {kind}s are {colour}, {colour} and {colour}."]
    for background in BACKGROUNDS:
        lines += [f"A shape on a {background} background.", f"The background is {background}."]
    lines += ["There is 1 shape.", "There are 2 shapes.", "There are 3 shapes.",
              "Image 1: A shape. Image 2: A shape. Image 3: Two shapes."]
    lines += [sd.compare_counts(a, b) for a in (1, 2, 3) for b in (1, 2, 3)]
    lines += [sd.TEXT_ONLY_ANSWER]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def shape_vocab() -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """((token, id) pairs for every token, special ones included), (merges)) of the default model's tokenizer."""
    vocab, merges = byte_fallback_vocab(corpus(), NUM_MERGES)
    return tuple(vocab.items()), tuple(merges)


def build_shape_tokenizer():
    """The ``tokenizers.Tokenizer`` of the default model (see the module docstring)."""
    vocab, merges = shape_vocab()
    return gemma_bpe_tokenizer(dict(vocab), list(merges))


def special_token_ids() -> dict[str, int]:
    """Every Gemma 3 special token -> its id in this vocabulary."""
    vocab = dict(shape_vocab()[0])
    return {tok: vocab[tok] for tok in HEAD_SPECIAL_TOKENS + TAIL_SPECIAL_TOKENS}
