"""Structured outputs: a constraint on what a request may generate (a JSON schema, a regular expression, a choice of
strings, a Lark grammar), enforced token by token with llguidance.

A ``Constraint`` is an llguidance grammar (its text) with a short description; ``json_schema``, ``json_object``,
``regex``, ``choice`` and ``grammar`` make one, and ``from_response_format`` reads OpenAI's ``response_format``
(``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``, ``{"type": "json_object"}``, and the
extensions ``{"type": "regex", "regex"}``, ``{"type": "choice", "choice"}``, ``{"type": "grammar", "grammar"}``).
``validate`` checks a constraint's grammar without a model (a malformed one raises ``ConstraintError`` naming
llguidance's message).

``Grammars`` (one per loaded model) wraps the model's tokenizer for llguidance once, at the first constrained
request (about a second for a large vocabulary), compiles constraints into matchers (the last few compiled are
kept; every request gets a copy of its own), and computes the token masks of a step: ``fill_masks`` writes one bit
per vocabulary id (bit v % 32 of word v // 32: 1 = allowed), int32 [rows, words], -1 (every token) for a row
without a constraint. The device applies them to the logits (``sampling.apply_bitmask``).

JSON comes on one line with ``json.dumps``' default separators (``{"a": 1, "b": [2, 3]}``) and no free whitespace,
so a schema with bounded values has a bounded answer (a model allowed any whitespace may emit it without end); a
schema's ``x-guidance`` options (llguidance's JSON compile options) override that.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from typing import Any, Sequence

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from omnijax.common.errors import CapabilityError, ConstraintError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "regex", "choice", "grammar")
MAX_MESSAGE_CHARS = 500  # of llguidance's error message in ours
KEPT_GRAMMARS = 32  # compiled constraints a model keeps (each request copies one)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What a request may generate: ``grammar``, an llguidance grammar (the text ``LLMatcher`` takes), and
    ``description`` (e.g. "json_schema 'answer'", for messages)."""

    grammar: str
    description: str


def _refuse(where: str, message: str) -> ConstraintError:
    return ConstraintError(f"{where}: {message}"[:MAX_MESSAGE_CHARS + 200])


def json_schema(schema: Any, name: str | None = None, where: str = "response_format") -> Constraint:
    """A JSON value following ``schema`` (a dict, or its JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise _refuse(where, f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise _refuse(where, f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError, RecursionError) as e:
        raise _refuse(where, f"the JSON schema cannot be compiled: {e}") from None
    return Constraint(text, "json_schema" + (f" {name!r}" if name else ""))


def json_object(where: str = "response_format") -> Constraint:
    """Any JSON object (OpenAI's JSON mode)."""
    return dataclasses.replace(json_schema({"type": "object"}, where=where), description="json_object")


def regex(pattern: Any, where: str = "response_format") -> Constraint:
    """Text that matches ``pattern`` whole (Rust ``regex`` syntax)."""
    if not isinstance(pattern, str):
        raise _refuse(where, f"a regex must be a string, got {type(pattern).__name__}")
    return Constraint(llguidance.LLMatcher.grammar_from_regex(pattern), "regex")


def choice(options: Any, where: str = "response_format") -> Constraint:
    """Exactly one of the strings ``options``."""
    if isinstance(options, str) or not isinstance(options, Sequence) or not options \
            or not all(isinstance(o, str) for o in options):
        raise _refuse(where, "a choice must be a non-empty list of strings")
    return Constraint(llguidance.grammar_from("choice", list(options)), f"choice of {len(options)}")


def grammar(text: Any, where: str = "response_format") -> Constraint:
    """Text of a Lark grammar (llguidance's dialect; a GBNF grammar, llama.cpp's, is converted to it)."""
    if not isinstance(text, str):
        raise _refuse(where, f"a grammar must be a string, got {type(text).__name__}")
    try:
        return Constraint(llguidance.grammar_from("grammar", text), "grammar")
    except ValueError as e:
        raise _refuse(where, str(e)) from None


def from_response_format(value: Any, where: str = "response_format") -> Constraint | None:
    """The constraint of OpenAI's ``response_format`` (a dict; ``{"type": "text"}`` and None: none) or a Constraint
    as it is; ConstraintError (naming ``where``) when it is malformed or its grammar is refused."""
    if value is None or isinstance(value, Constraint):
        return value
    if not isinstance(value, dict):
        raise _refuse(where, f"must be an object with a 'type', got {type(value).__name__}")
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise _refuse(where, f"type {str(kind)[:100]!r} is not supported (one of {', '.join(RESPONSE_FORMATS)})")
    if kind == "text":
        return None
    if kind == "json_object":
        return validate(json_object(where), where)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise _refuse(where, "type 'json_schema' needs 'json_schema': {'name': ..., 'schema': {...}}")
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise _refuse(where, "json_schema.name must be a string")
        if spec.get("strict") not in (None, True, False):
            raise _refuse(where, "json_schema.strict must be a boolean")
        return validate(json_schema(spec["schema"], name, where), where)
    if kind not in value:
        raise _refuse(where, f"type {kind!r} needs the field {kind!r}")
    build = {"regex": regex, "choice": choice, "grammar": grammar}[kind]
    return validate(build(value[kind], where), where)


def validate(constraint: Constraint, where: str = "response_format",
             tokenizer: llguidance.LLTokenizer | None = None) -> Constraint:
    """``constraint`` when llguidance compiles its grammar (for ``tokenizer``'s vocabulary, when given), else
    ConstraintError with llguidance's message."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(constraint.grammar, tokenizer)
    if failed:
        raise _refuse(where, f"the {constraint.description} cannot be compiled: "
                             f"{messages[0][:MAX_MESSAGE_CHARS] if messages else 'no reason given'}")
    return constraint


def fill_masks(matchers_R: Sequence[llguidance.LLMatcher | None], words: int,
               executor: llguidance.LLExecutor | None = None) -> np.ndarray:
    """The next token's mask of each row: int32 [rows, words], row r the allowed tokens of ``matchers_R[r]`` (bit v %
    32 of word v // 32), -1 (all allowed) where it is None. The matchers' masks are computed in parallel."""
    mask_RW = np.full((len(matchers_R), words), -1, np.int32)
    rows = [(m, r) for r, m in enumerate(matchers_R) if m is not None]
    if rows:
        fill_next_token_bitmask_par(executor or llguidance.LLExecutor(), rows, mask_RW)
    return mask_RW


class Grammars:
    """The constraints of one loaded model. ``tokenizer``: its transformers tokenizer (a fast one: llguidance reads
    the ``tokenizers`` definition); ``vocab_size``: the logits' width; ``eos_ids``: its end ids (what a grammar
    allows once it is complete). Safe to use from several threads."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        self._hf = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = [int(t) for t in eos_ids]
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: collections.OrderedDict[str, llguidance.LLMatcher] = collections.OrderedDict()
        self._executor: llguidance.LLExecutor | None = None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance tokenizer (made at first use). It covers every id of the tokenizer and of the logits: a
        tokenizer may hold ids past the logits (Gemma 3's image soft token is the vocabulary size itself; the mask
        bits past the logits are never read) and the logits ids past the tokenizer (padding rows: never allowed)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._wrap()
            return self._tokenizer

    def _wrap(self) -> llguidance.LLTokenizer:
        import llguidance.hf

        from omnijax.preprocess.tokenizer import tokenizer_size

        if self._hf is None or not hasattr(self._hf, "backend_tokenizer"):
            raise CapabilityError(f"structured outputs (response_format) need a fast (tokenizers) tokenizer; this "
                                  f"model's is {type(self._hf).__name__}")
        n_vocab = max(self.vocab_size, tokenizer_size(self._hf))
        try:
            return llguidance.hf.from_tokenizer(self._hf, n_vocab=n_vocab, eos_token=self.eos_ids)
        except ValueError as e:
            raise CapabilityError(f"structured outputs (response_format): llguidance cannot use this model's "
                                  f"tokenizer: {e}") from None

    @property
    def words(self) -> int:
        """int32 words of a token mask row: one bit per id of the llguidance tokenizer."""
        return -(-self.tokenizer.vocab_size // 32)

    def check(self, constraint: Constraint, where: str = "response_format") -> Constraint:
        """``constraint`` compiled for this model's vocabulary (kept for ``matcher``); ConstraintError naming
        llguidance's message when it cannot be."""
        self._compile(constraint, where)
        return constraint

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A new matcher of ``constraint`` at the start of an answer (ConstraintError as ``check``)."""
        compiled = self._compile(constraint, "response_format")
        with self._lock:
            return compiled.deep_copy()

    def _compile(self, constraint: Constraint, where: str) -> llguidance.LLMatcher:
        tokenizer = self.tokenizer
        with self._lock:
            if constraint.grammar in self._compiled:
                self._compiled.move_to_end(constraint.grammar)
                return self._compiled[constraint.grammar]
        matcher = llguidance.LLMatcher(tokenizer, constraint.grammar, log_level=0)  # (outside the lock: it may take
        # a while for a large grammar)
        if matcher.is_error():
            raise _refuse(where, f"the {constraint.description} cannot be compiled: "
                                 f"{matcher.get_error()[:MAX_MESSAGE_CHARS]}")
        with self._lock:
            self._compiled[constraint.grammar] = matcher
            while len(self._compiled) > KEPT_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher

    def masks(self, matchers_R: Sequence[llguidance.LLMatcher | None]) -> np.ndarray:
        """``fill_masks`` of this model's rows (int32 [rows, words])."""
        words = self.words
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        return fill_masks(matchers_R, words, self._executor)
