"""A generation request as the serving engine sees it, the events it streams back, and its result.

``Request`` is what a caller submits (a prepared prompt plus its own sampling settings); ``RequestHandle`` is what
it gets back: a thread-safe stream of ``TokenEvent``s (one per generated token: the token id and the text it
settles) ending with the ``GenerationResult``, and ``cancel()``, which frees the request's slot at the engine's next
step. The engine's scheduler thread is the only writer; any thread may read.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Iterator

import numpy as np

from omnijax.app.grammar import Constraint
from omnijax.app.sampling import SamplingParams
from omnijax.app.token_logprobs import TokenLogprob
from omnijax.common.interruptible import get_item, wait_event
from omnijax.preprocess.processor import PreparedPrompt

log = logging.getLogger(__name__)

FINISH_REASONS = ("eos", "stop", "length", "cancelled")


@dataclasses.dataclass
class GenerationResult:
    """text: the answer (special tokens removed, cut before a stop string); token_ids: generated ids (an EOS that ended
    the answer included, as transformers' generate returns it); finish_reason: "eos", "stop" (a stop string, or a
    constraint that is complete), "length" or "cancelled"; cached_tokens: prompt tokens whose keys / values came
    from the prefix cache; seconds: from submission to the last token; first_token_seconds: from submission to the
    first token. A spoken answer (``speak=True``) adds audio (float32 mono samples in [-1, 1]), sample_rate (Hz) and
    audio_codes (int32 [frames, code groups], the codec codes the audio was made from); None otherwise.
    prompt_logits: float32 [prompt tokens, vocab], the logits at every prompt position, for a request that asked for
    them (``Request.prompt_logits``); prompt_logprobs: float32 [prompt tokens - 1], the natural-log probability of
    each prompt token after the first given those before it (``Request.prompt_logprobs``), and prompt_top: per such
    token, as many of its most likely alternatives as ``Request.prompt_logprobs`` asks ((token id, log probability)
    pairs, most likely first; None when it asks for none). logprobs: one
    ``TokenLogprob`` per generated token (the token's natural-log probability under the model's distribution, before
    any sampling setting, and its most likely alternatives) for a request that asked for them
    (``Request.logprobs``); None otherwise. tool_calls: the calls the answer holds (app/tools.py's
    ToolCall) and content: its text before them, for a request that offered tools (``Pipeline.read_tool_calls``);
    None otherwise."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    seconds: float = 0.0
    cached_tokens: int = 0
    first_token_seconds: float | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    audio_codes: np.ndarray | None = None
    prompt_logits: np.ndarray | None = None
    prompt_logprobs: np.ndarray | None = None
    prompt_top: list[tuple[tuple[int, float], ...]] | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list | None = None
    content: str | None = None


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt to answer. ``ignore_eos``: generate exactly ``max_new_tokens`` (end ids do not end it);
    ``stop``: stop strings (checked by ``check_stops``); ``prompt_logits``: also return the logits at every prompt
    position; ``prompt_logprobs``: None, or also return each prompt token's log-probability given the ones before
    it (computed on the device: one float per token comes back) with that many (0..20) most likely alternatives
    there (``GenerationResult.prompt_top``). With either, the whole prompt is prefilled (none of
    it taken from the prefix cache) and kept out of the prefix cache. ``logprobs``: None, or how many of the most
    likely alternatives (0..20) each generated token's ``TokenLogprob`` carries (checked by
    ``app.token_logprobs.check_logprobs``), under the distribution ``logprobs_mode`` names ("raw": the model's own,
    before the sampling settings, the default; "processed": the one the token is drawn from, after temperature,
    top-k and top-p; ``app.token_logprobs.MODES``). ``group``: requests of one group (any value compared with
    ``==``: the choices of one prompt) share its prefill: one waits while another of its group prefills the prompt,
    then takes it from the prefix cache. ``constraint``: what the answer may be (structured outputs, app/grammar.py:
    a JSON schema, regex, choice or grammar, enforced token by token; the answer ends, finish_reason "stop", once
    the constraint is complete)."""

    prompt: PreparedPrompt
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    prompt_logits: bool = False
    prompt_logprobs: int | None = None
    logprobs: int | None = None
    logprobs_mode: str = "raw"
    group: object = None
    constraint: Constraint | None = None

    @property
    def whole_prompt(self) -> bool:
        """Whether every prompt position runs through the model (what the prompt's logits need)."""
        return self.prompt_logits or self.prompt_logprobs is not None


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """One generated token: its id and the text it settles ("" while it shows nothing yet); ``logprob``: its
    ``TokenLogprob`` when the request asks for log probabilities. The last event of an answer may carry no token
    (``token_id`` None): text held back until the end (an unfinished character)."""

    token_id: int | None
    text: str
    logprob: TokenLogprob | None = None


class RequestHandle:
    """A submitted request: iterate ``events()`` for its tokens as they come, or ``result()`` to wait for the end.

    The scheduler calls ``_emit`` / ``_finish`` (its thread only); ``cancel`` may be called from any thread, any
    number of times, also after the end."""

    def __init__(self, request: Request, on_cancel, listener=None):
        """listener: called (from the engine's thread) after every new event and at the end, e.g. to wake an
        event loop; it must not block."""
        self.request = request
        self.submitted = time.perf_counter()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._on_cancel = on_cancel
        self._listener = listener
        self._ended = False  # the end mark has been taken by ``take``
        self.cancelled = False

    # ---- caller side -----------------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop generating: the request ends with finish_reason "cancelled" at the engine's next step."""
        if not self.cancelled and not self._done.is_set():
            self.cancelled = True
            self._on_cancel(self)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Token events as they are generated; the iteration ends when the request ends (an engine error is raised
        here). ``timeout``: the longest wait for one event (``queue.Empty`` past it)."""
        while True:
            item = get_item(self._events, timeout)
            if item is None:
                if self._error is not None:
                    raise self._error
                return
            yield item

    def take(self) -> tuple[list[TokenEvent], bool]:
        """Without waiting: the events that have come, and whether the request has ended (after them). An engine
        error is raised once every event before it has been taken."""
        events = []
        while not self._ended:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._ended = True
            else:
                events.append(item)
        if self._ended and not events and self._error is not None:
            raise self._error
        return events, self._ended

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the end; the GenerationResult (an engine error is raised here)."""
        if not wait_event(self._done, timeout):
            raise TimeoutError("the request has not finished")
        if self._error is not None:
            raise self._error
        return self._result

    # ---- scheduler side --------------------------------------------------------------------------------------
    def _emit(self, event: TokenEvent) -> None:
        self._events.put(event)
        if not self._notify():
            self.cancel()  # its consumer is gone: this request stops, no other

    def _finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()
        self._events.put(None)
        self._notify()

    def _notify(self) -> bool:
        """Call the listener; False (and no listener from then on) when it raised: the failure is this request's
        consumer's, so it is logged here and never reaches the engine's loop, which serves other requests too."""
        if self._listener is None:
            return True
        try:
            self._listener()
            return True
        except Exception:  # noqa: BLE001 - any failure of a caller's callback
            log.exception("a request's listener failed; the request is cancelled")
            self._listener = None
            return False
