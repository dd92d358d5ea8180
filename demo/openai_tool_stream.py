"""The ``tool_calls`` deltas of one streamed chat choice that may call tools: the answer's raw text (special tokens
included: Gemma 4's and Llama 4's markers are some; end tokens left out) grows by what each token settles
(app/detokenize.py: incremental decoding) and is read again by app/tool_calls.py's ``CallStream``; content goes out
once it cannot start a call, each call in one delta (``index``, ``id``, ``type``, ``function.name`` and its whole
``arguments``) once it is complete."""

from __future__ import annotations

from omnijax.app.detokenize import IncrementalDetokenizer
from omnijax.app.tool_calls import CallStream
from omnijax.app.tools import ToolCall
from omnijax.preprocess.tokenizer import byte_fallback_ids, special_tokens


class ToolDeltas:
    """The deltas of one choice of ``pipe`` (a Pipeline) answering with ``tools`` (a ToolRequest)."""

    def __init__(self, pipe, tools):
        self.pipe = pipe
        tokenizer = pipe.processor.tokenizer
        self.raw = ""  # the answer's raw text settled so far (``Pipeline.raw_answer`` of its tokens, a prefix)
        self.detokenizer = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
                                                  skip_ids=pipe.config.eos_ids, byte_ids=byte_fallback_ids(tokenizer))
        self.stream = CallStream(tools.fmt, special_tokens(tokenizer))

    @property
    def calls_sent(self) -> int:
        return len(self.stream.calls)

    def _deltas(self, content: str, calls: list[ToolCall]) -> list[dict]:
        out = [{"content": content}] if content else []
        first = self.calls_sent - len(calls)
        for k, call in enumerate(calls):
            out.append({"tool_calls": [{"index": first + k, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": call.arguments}}]})
        return out

    def update(self, token_id: int | None) -> list[dict]:
        """The deltas a new token gives (none for an event without a token)."""
        piece = "" if token_id is None else self.detokenizer.push(int(token_id))
        if not piece:
            return []
        self.raw += piece
        return self._deltas(*self.stream.update(self.raw))

    def finish(self, result) -> list[dict]:
        """The deltas left once the answer (``result``, a GenerationResult) has ended."""
        return self._deltas(*self.stream.finish(self.pipe.raw_answer(result.token_ids)))
