"""The serving engine's host side: requests join and leave between decode steps over a fixed number of slots.

One thread owns the device state (app/slots.py) and loops:

1. take new requests and cancellations (any thread submits; ``submit`` checks the prompt fits first);
2. give free slots to waiting requests, oldest first: encode their media (app/media_cache.py, each item once),
   find the longest cached prefix (app/prefix_cache.py) and copy it into the slot (a request of a ``group``, the
   choices of one prompt, waits while another of its group prefills that prompt, then takes it from the prefix
   cache: one prefill for all);
3. dispatch one step (app/slots.py): a token for every active slot (each with its own sampling settings) and,
   in the same program, the next prompt chunk of up to four prefilling requests, oldest first, within
   ``max_batched_tokens`` prompt tokens (shared between them, so a new request starts at the next step however
   long the prompts before it are); after a request's last chunk its first token is drawn and its slot made
   active (and its keys / values kept as a prefix entry);
4. read back the previous step's tokens (the device works on the next one meanwhile; with their log probabilities
   in a step where some request asks for them, app/token_logprobs.py): each request's answer text
   grows by O(1) work per token (app/answer_text.py); a request that ends (end id, stop string, max tokens,
   its constraint complete, cancellation) frees its slot for the next one.

A request with a constraint (structured outputs, app/grammar.py) holds an llguidance matcher, made when it is
submitted, that consumes each of its tokens. Its first token is drawn within the fresh matcher's mask. In a step
where some decode row is constrained, the previous step's tokens are read back while the device runs the forward
(step 4 moves there), the matchers' masks computed from them, and then the tokens drawn within the masks (the
sample program's masked variant); a step without a constrained row keeps the order above, with no wait.

Nothing here depends on the batch: a request's greedy tokens are the same alone or among others. With several JAX
processes (one mesh over them) there is no thread: ``run`` drives the loop in the caller, identically in every
process, so every process runs the same programs in the same order.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import threading
import time

import jax
import numpy as np

from omnijax.app.answer_text import AnswerText, answer_for
from omnijax.app.engine_stats import Stats
from omnijax.app.chunk_media import chunk_media, prompt_media
from omnijax.app.chunks import plan_chunks, prefix_points
from omnijax.app.generation import bucket_for
from omnijax.app.grammar import Grammars
from omnijax.app.media_cache import EncodedItem, MediaCache
from omnijax.app.prefix_cache import PrefixCache, PrefixEntry, key_ids
from omnijax.app.prompt_scores import PromptScores
from omnijax.app.requests import GenerationResult, Request, RequestHandle, TokenEvent
from omnijax.app.slots import DEFAULT_KV_CACHE_MB, DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_SLOTS, Chunk, Slots
from omnijax.app.token_logprobs import MODES, RAW, host_rows
from omnijax.common.errors import OmnijaxError, PromptError
from omnijax.common.sharding import host_array
from omnijax.preprocess.buckets import length_bucket

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 256
DEFAULT_PREFIX_CACHE_MB = 256
DEFAULT_MEDIA_CACHE_MB = 256
MIN_PREFIX_TOKENS = 16  # shorter prompts are not worth an entry
PREFIX_EVERY = 256  # a long prompt also keeps its keys / values at the last multiple of this many tokens


class QueueFullError(OmnijaxError):
    """The engine's queue of waiting requests is full (a server answers 503)."""


class ClosedError(OmnijaxError):
    """The engine was closed (``Pipeline.close``): it takes no more requests."""


@dataclasses.dataclass
class Live:
    """A request inside the engine."""

    handle: RequestHandle
    order: int
    answer: AnswerText
    slot: int | None = None
    ids: np.ndarray | None = None  # key ids of the prompt (app/prefix_cache.py)
    done: int = 0  # prompt tokens in the slot's cache (cached prefix and prefilled chunks)
    keep_at: set = dataclasses.field(default_factory=set)  # chunk ends whose keys / values become prefix entries
    media: dict = dataclasses.field(default_factory=dict)  # placeholder id -> (features [R, D], extras [E, R, D])
    scores: PromptScores = dataclasses.field(default_factory=PromptScores)  # what it asks of its prompt
    token_logprobs: list = dataclasses.field(default_factory=list)  # TokenLogprob per generated token (logprobs)
    matcher: object = None  # the llguidance matcher of a constrained request (app/grammar.py)
    generated: int = 0
    cached: int = 0
    first_token: float | None = None
    decoding: bool = False
    finished: bool = False

    @property
    def request(self) -> Request:
        return self.handle.request

    @property
    def prefilling(self) -> bool:
        """In a slot, with prompt tokens still to run."""
        return self.slot is not None and not self.decoding and not self.finished and \
            self.done < len(self.request.prompt.token_ids)


class Scheduler:
    """Continuous batching over ``slots`` slots for one loaded model.

    engine: app/generation.py's Engine; processor: the family processor (decoding tokens to text).
    context: the longest prompt plus answer one slot holds (default: the engine's context budget).
    max_batched_tokens: the prompt tokens one step runs beside the decode rows (a media block longer than that runs
    whole, alone). prefix_cache_mb / media_cache_mb: their budgets (0: off). kv_cache_mb: the paged KV cache's
    (app/slots.py; a request takes a slot when the pages of its prompt and answer are free too).
    max_queue: requests waiting for a slot (beyond those a free slot takes at the next step) above which ``submit``
    raises QueueFullError. threaded: run the loop in a thread of its own (False: the caller drives it with
    ``run``; what several JAX processes need)."""

    def __init__(self, engine, processor, *, slots: int = DEFAULT_SLOTS, context: int | None = None,
                 max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
                 media_cache_mb: float = DEFAULT_MEDIA_CACHE_MB, max_queue: int = DEFAULT_MAX_QUEUE,
                 kv_cache_mb: float = DEFAULT_KV_CACHE_MB, threaded: bool = True):
        if max_batched_tokens < 1 or max_queue < 1:
            raise ValueError(f"max_batched_tokens and max_queue must be >= 1, got {max_batched_tokens} and "
                             f"{max_queue}")
        self.engine = engine
        self.processor = processor
        self.slots = Slots(engine, slots=slots, context=context, kv_cache_mb=kv_cache_mb)
        self.max_batched_tokens = max_batched_tokens
        self.max_queue = max_queue
        self.media = MediaCache(self._encode_one, int(media_cache_mb * 2**20))
        self.prefix = PrefixCache(int(prefix_cache_mb * 2**20))
        self.stats = Stats()
        self.grammars = Grammars(getattr(processor, "tokenizer", None), engine.cfg.decoder.vocab_size,
                                 engine.cfg.eos_ids)
        self.threaded = threaded
        self._inbox: collections.deque = collections.deque()
        self._cancels: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._waiting: collections.deque[Live] = collections.deque()
        self._slot_of: list[Live | None] = [None] * self.slots.slots
        self._pending = None  # (tokens, active, lives, log probabilities) of the decode step not read back yet
        self._firsts: list = []  # (live, first token, its log probabilities) of requests inserted at this step, read
        # back at the next
        self._unread_firsts: list = []  # those of the step before, while this step reads them back
        self._order = 0
        self._thread: threading.Thread | None = None
        self._stop = False

    # ---- any thread ----------------------------------------------------------------------------------------
    @property
    def context(self) -> int:
        return self.slots.context

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """PromptError unless a prompt of this length and this many new tokens fits a slot (the KV cache's pools
        hold at least one whole context: such a request runs, at the latest once the others have ended)."""
        if prompt_tokens == 0:
            raise PromptError("the prompt is empty")
        if prompt_tokens >= self.context:
            raise PromptError(f"the prompt has {prompt_tokens} tokens; the context budget is {self.context} tokens "
                              f"(prompt plus at least one new token)")
        if prompt_tokens + max_new_tokens > self.context:
            raise PromptError(f"the prompt has {prompt_tokens} tokens and max_new_tokens is {max_new_tokens}: "
                              f"{prompt_tokens + max_new_tokens} exceeds the context budget of {self.context} "
                              f"tokens")

    def submit(self, request: Request, listener=None) -> RequestHandle:
        """Queue ``request``; its handle streams the tokens (``listener``: see RequestHandle). PromptError when it
        cannot fit, QueueFullError when ``max_queue`` requests wait already with no free slot for them (requests
        that arrive together while slots are free are not refused: the next step takes them); ConstraintError when
        its constraint does not compile (its matcher is made here, in the caller's thread)."""
        self.check_fits(len(request.prompt.token_ids), request.max_new_tokens)
        matcher = None if request.constraint is None else self.grammars.matcher(request.constraint)
        handle = RequestHandle(request, self._cancel, listener)
        with self._wake:
            if self._stop:
                raise ClosedError("the pipeline is closed: it takes no more requests (load it again)")
            if len(self._inbox) + len(self._waiting) >= self.max_queue + self._slot_of.count(None):
                raise QueueFullError(f"the engine's queue is full ({self.max_queue} requests are waiting)")
            self._inbox.append((handle, matcher))
            self._wake.notify()
        if self.threaded:
            self._ensure_thread()
        return handle

    def _cancel(self, handle: RequestHandle) -> None:
        with self._wake:
            self._cancels.append(handle)
            self._wake.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._inbox) + len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing is inside the engine: no request, cancellation or step left to read back."""
        return not self._has_work()

    @property
    def running(self) -> int:
        return sum(live is not None for live in self._slot_of)

    def warm_up(self) -> None:
        """Compile what text requests run (every step shape: decode row counts, and chunk groups of each row count
        of ``Slots.chunk_counts`` and each length within ``max_batched_tokens``) now, so the first requests do not
        wait for it. Call it before any request."""
        shapes = [(c, t) for c in self.slots.chunk_counts for t in self.engine.buckets if self._fits(c, t)]
        self.slots.warm_up(shapes)

    def _fits(self, rows: int, length: int) -> bool:
        """Whether a chunk group of ``rows`` chunks padded to ``length`` tokens is within the step's budget (one
        chunk: up to the budget's bucket; several: their padded tokens within the budget, or within one of the
        smallest bucket each when the budget is smaller)."""
        if rows == 1:
            return length <= bucket_for(self.max_batched_tokens, self.engine.buckets)
        return rows * length <= max(self.max_batched_tokens, rows * self.engine.buckets[0])

    def compilations(self) -> int:
        """Programs compiled so far by the engine (media encoders) and the slots."""
        return self.engine.compilations() + self.slots.compilations()

    def close(self) -> None:
        """Stop the loop thread (requests still inside end as cancelled)."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    # ---- the loop ------------------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._wake:
            if self._thread is None or not self._thread.is_alive():
                if self._thread is None:  # stopped before the interpreter goes: a thread killed inside XLA aborts
                    atexit.register(self.close)
                self._thread = threading.Thread(target=self._serve, name="omnijax-engine", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self._has_work():
                    self._wake.wait()
                if self._stop:
                    break
            self.step()
        self._take_inbox()  # requests submitted just before the stop end too
        for live in list(self._waiting) + [x for x in self._slot_of if x is not None]:
            self._end(live, "cancelled")

    def _has_work(self) -> bool:
        return bool(self._inbox or self._cancels or self._waiting or self._pending is not None or self._firsts
                    or any(x is not None for x in self._slot_of))

    def run(self, handles: list[RequestHandle] | None = None) -> None:
        """Drive the loop in this thread until ``handles`` (default: every request inside) have finished."""
        while (any(not h.done for h in handles) if handles is not None else self._has_work()):
            self.step()

    def step(self) -> None:
        """One turn of the loop (module docstring). A failure while starting or prefilling one request (before any
        program took the device state) ends that request only; any other failure (a decode step, reading one
        back, a program that failed after it was given the donated cache and slot state) ends the requests in the
        slots, and the device state is allocated again, so the engine keeps serving. Requests still waiting go on
        either way."""
        try:
            self._take_inbox()
            self._admit()
            self._unread_firsts, self._firsts = self._firsts, []
            dispatched = self._dispatch()
            self._read_back()  # (done already in a step with a constrained row)
            self._pending = dispatched
        except Exception as e:  # noqa: BLE001 - a step over the slots failed: the requests in them end with it
            log.exception("engine step failed")
            self._fail_slots(e)

    def _read_back(self) -> None:
        """The previous step's first tokens and decode tokens to their requests (once per step)."""
        firsts, self._unread_firsts = self._unread_firsts, []
        for live, token, logprobs in firsts:
            self._read_first(live, token, logprobs)
        pending, self._pending = self._pending, None
        if pending is not None:
            self._read_step(*pending)

    @staticmethod
    def _error(e: Exception) -> Exception:
        return e if isinstance(e, OmnijaxError) else RuntimeError(f"engine error: {e}")

    def _fail_request(self, live: Live, e: Exception, *, device_state_used: bool) -> None:
        """``live`` failed on its own: it ends with the error and the others go on, unless the failure came from a
        program given the device state (``device_state_used``), which may now be gone or hold the failure."""
        if device_state_used:
            self._fail_slots(e)
            return
        if not isinstance(e, OmnijaxError):
            log.exception("request failed in the engine")
        self._end(live, None, error=self._error(e))

    def _fail_slots(self, e: Exception) -> None:
        """Every request in a slot ends with ``e`` and the device state is allocated again (zeroed, every slot
        idle): what a failed program was given may be gone, or hold its failure, which surfaces only when read."""
        self._pending = None
        self._firsts, self._unread_firsts = [], []
        for live in [x for x in self._slot_of if x is not None]:
            self._end(live, None, error=self._error(e))
        self.slots.reset()

    def _take_inbox(self) -> None:
        with self._wake:
            new, self._inbox = list(self._inbox), collections.deque()
            cancels, self._cancels = list(self._cancels), collections.deque()
        for handle, matcher in new:
            stops, eos = handle.request.stop, () if handle.request.ignore_eos else self.engine.cfg.eos_ids
            self._waiting.append(Live(handle, self._order, answer_for(self.processor, stops, eos), matcher=matcher))
            self._order += 1
        for handle in cancels:
            live = next((x for x in list(self._waiting) + self._slot_of if x is not None and x.handle is handle),
                        None)
            if live is not None and not live.finished:
                if live.decoding:
                    self.slots.release(live.slot)
                self._end(live, "cancelled")

    def _admit(self) -> None:
        held = []
        while self._waiting and None in self._slot_of:
            live = self._waiting[0]
            tokens = len(live.request.prompt.token_ids) + live.request.max_new_tokens
            if not self.slots.pages.fits(tokens):  # it waits (and those after it) until others give pages back
                break
            self._waiting.popleft()
            if self._after_prefill_of_its_group(live):
                held.append(live)
                continue
            live.slot = self._slot_of.index(None)
            self._slot_of[live.slot] = live
            self.slots.pages.take(live.slot, tokens)
            self.stats.peak_running = max(self.stats.peak_running, self.running)
            before = self.slots.dispatched
            try:
                self._start(live)
            except Exception as e:  # noqa: BLE001 - this request's media or prefix failed: it ends alone
                self._fail_request(live, e, device_state_used=self.slots.dispatched != before)
        self._waiting.extendleft(reversed(held))

    def _after_prefill_of_its_group(self, live: Live) -> bool:
        """Whether ``live`` waits for a request of its ``group`` (the same prompt: the choices of one ``n`` > 1
        request) still prefilling in a slot: once that one's prompt is a prefix cache entry, ``live`` takes it from
        there (its keys, values and last logits) instead of running the prompt again."""
        group = live.request.group
        if group is None or live.request.whole_prompt or not self.prefix.enabled \
                or len(live.request.prompt.token_ids) < MIN_PREFIX_TOKENS:
            return False
        return any(x is not None and x.request.group == group and not x.decoding and not x.request.whole_prompt
                   for x in self._slot_of)

    def _start(self, live: Live) -> None:
        """Media encoded, a cached prefix copied into the slot, the points where its keys / values are kept."""
        self.slots.ensure_allocated()
        prompt = live.request.prompt
        placeholders, media = {}, {}
        deep = self.engine.cfg.deepstack_ids(prompt.media)
        for modality, items in prompt.media.items():
            token_id = self.engine.cfg.media_token_id(modality)
            rows = self.media.rows(modality, items)
            placeholders[token_id] = [(digest, len(item.features)) for digest, item in rows]
            media[token_id] = prompt_media([item for _, item in rows], self.engine.cfg.decoder.deepstack_layers,
                                           token_id in deep)
        live.media = media
        live.ids = key_ids(prompt.token_ids, placeholders)
        n = len(live.ids)
        start = 0
        whole = live.request.whole_prompt
        entry = None if whole else self.prefix.lookup(live.ids)
        if entry is not None:
            self.slots.restore(live.slot, entry.saved, entry.length)
            start = live.cached = entry.length
        points = prefix_points(start, n, prompt.bidirectional, PREFIX_EVERY) if self.prefix.enabled and not whole \
            else ()
        live.keep_at = {p for p in points if p >= MIN_PREFIX_TOKENS}
        live.done = start
        if start == n:  # the whole prompt was cached, with its logits
            self._insert(live, entry.logits)

    def _encode_one(self, modality: str, item) -> EncodedItem:
        out = self.engine.encode({modality: [item]})[modality]  # (features, valid[, extras])
        features, valid, extras = out[0], out[1], tuple(out[2]) if len(out) > 2 else ()
        valid = host_array(valid) if valid is not None else np.ones(features.shape[0], bool)
        return EncodedItem(host_array(features)[valid], tuple(host_array(e)[valid] for e in extras))

    def _plan(self) -> list[tuple[Live, int, int]]:
        """The prompt chunks of the next step: (live, a, b) for prompt tokens a..b-1 of up to the largest of
        ``Slots.chunk_counts`` prefilling requests, oldest first, sharing ``max_batched_tokens`` (fewer requests
        when their chunks do not fit: a media block is never split; the oldest always runs)."""
        todo = sorted((x for x in self._slot_of if x is not None and x.prefilling), key=lambda x: x.order)
        rows = self.slots.chunk_rows(len(todo))
        while todo:
            share = max(self.max_batched_tokens // rows, 1)
            picked = []
            for live in todo[:rows]:
                prompt = live.request.prompt
                a, b = plan_chunks(live.done, len(prompt.token_ids), prompt.bidirectional, share,
                                   tuple(live.keep_at))[0]
                picked.append((live, a, b))
            if rows == self.slots.chunk_counts[0] or \
                    self._fits(rows, bucket_for(max(b - a for _, a, b in picked), self.engine.buckets)):
                return picked
            rows = max(c for c in self.slots.chunk_counts if c < rows)
        return []

    def _dispatch(self):
        """One step: the decode rows and the planned prompt chunks in one program (two when the batch axis is split
        over devices: the chunks first); then each finished prompt's first token drawn. Returns what the decode
        rows will read back (None when no row decoded)."""
        chunks, planned = [], []
        for live, a, b in self._plan():
            try:
                chunks.append(self._chunk(live, a, b))
                planned.append((live, a, b))
            except Exception as e:  # noqa: BLE001 - this request's chunk could not be made: it ends alone
                self._fail_request(live, e, device_state_used=False)
        decoding = any(x is not None and x.decoding and not x.finished for x in self._slot_of)
        if not planned and not decoding:
            return None
        group = None
        if planned:
            group = self.slots.chunk_group(chunks, bucket_for(max(b - a for _, a, b in planned), self.engine.buckets))
        rows = 0
        if decoding or (planned and self.slots.decode_rows_with_chunks):
            # the rows up to the highest occupied slot, prefilling ones included (inactive: the step leaves them
            # be), so a burst of requests decodes at one row count from its first step and compiles one program,
            # not each bucket on the way up; beside prompt chunks the first 8 slots or every slot (at most two
            # programs per chunk shape)
            highest = max(i for i, x in enumerate(self._slot_of) if x is not None)
            rows = self.slots.rows_beside_chunks(highest) if planned and self.slots.decode_rows_with_chunks else \
                self.slots.rows_for(highest)
        lives = list(self._slot_of[:rows])
        # log probabilities only in a step where some request asks for them (another program: compiled at first use)
        wanted = any(x is not None and x.decoding and x.request.logprobs is not None for x in lives)
        # token masks only in a step with a constrained row (likewise)
        mask = self._masks(lives) if any(x is not None and x.decoding and x.matcher is not None for x in lives) \
            else None
        dispatched = None
        if rows:  # (counted first: a constrained step's requests may end while it is being dispatched)
            self.stats.steps += 1
        if group is not None and not self.slots.decode_rows_with_chunks:
            _, _, logits, hidden, _ = self.slots.step(0, group)
            if rows:
                tokens, active, _, _, logprobs = self.slots.step(rows, logprobs=wanted, mask=mask)
                dispatched = tokens, active, lives, logprobs
        else:
            tokens, active, logits, hidden, logprobs = self.slots.step(rows, group, logprobs=wanted, mask=mask)
            if rows:
                dispatched = tokens, active, lives, logprobs
        for i, (live, a, b) in enumerate(planned):
            if live.finished:  # ended by an earlier chunk's failure
                continue
            before = self.slots.dispatched
            try:
                mine = lambda x: x if x.shape[0] == 1 else x[i:i + 1]  # noqa: E731 - its row of the group
                self._chunk_done(live, a, b, mine(logits), mine(hidden))
            except Exception as e:  # noqa: BLE001 - ends alone if on the host
                self._fail_request(live, e, device_state_used=self.slots.dispatched != before)
        return dispatched

    def _masks(self, lives: list):
        """The step's mask function (``Slots.step``): called while the device runs the forward, it reads the previous
        step back (the matchers consume its tokens) and returns the rows' token masks, or None when no decoding row
        is constrained any more."""

        def masks():
            self._read_back()
            matchers = [x.matcher if x is not None and x.decoding and not x.finished else None for x in lives]
            return self.grammars.masks(matchers) if any(m is not None for m in matchers) else None

        return masks

    def _chunk(self, live: Live, a: int, b: int) -> Chunk:
        prompt = live.request.prompt
        rope = np.arange(a, b)[None] if prompt.rope_positions is None else prompt.rope_positions[:, a:b]
        return Chunk(prompt.token_ids[a:b], a, live.slot, rope, prompt.bidirectional[a:b],
                     chunk_media(prompt.token_ids, live.media, a, b))

    def _chunk_done(self, live: Live, a: int, b: int, logits, hidden) -> None:
        """After the step ran prompt tokens a..b-1 of ``live`` (``logits`` [1, V] at b-1, ``hidden`` [1, T, D]):
        the rows a request asked for, prefix entries, and after the last chunk its first token."""
        ids = live.request.prompt.token_ids
        live.done = b
        live.scores.add(self.slots, live.request, self.engine.cfg.pad_id, a, b, hidden)
        n = len(ids)
        if b < n:
            if b in live.keep_at:
                self._keep_prefix(live, b, None)
            return
        if self.prefix.enabled and n >= MIN_PREFIX_TOKENS and live.cached < n and not live.request.whole_prompt:
            self._keep_prefix(live, n, logits)
        self._insert(live, logits)

    def _insert(self, live: Live, logits) -> None:
        req = live.request
        mask = None if live.matcher is None else self.grammars.masks([live.matcher])
        token, logprobs = self.slots.insert(live.slot, logits, req.sampling, req.max_new_tokens,
                                            req.prompt.rope_delta, not req.ignore_eos, req.logprobs is not None,
                                            mask=mask)
        live.decoding = True
        self._firsts.append((live, token, logprobs))

    def _keep_prefix(self, live: Live, length: int, logits) -> None:
        saved = self.slots.snapshot(live.slot, length_bucket(length, 64))
        nbytes = sum(int(a.nbytes) for a in jax.tree.leaves(saved)) + (0 if logits is None else int(logits.nbytes))
        self.prefix.store_entry(live.ids, PrefixEntry(saved, length, logits, nbytes))

    def _read_first(self, live: Live, token, logprobs) -> None:
        live.first_token = time.perf_counter()
        self.stats.first_token(live.first_token - live.handle.submitted)
        token = host_array(token).reshape(1)
        record = None if logprobs is None else \
            host_rows(tuple(host_array(a) for a in logprobs), token, [live.request.logprobs],
                      [MODES.index(live.request.logprobs_mode)])[0]
        self._push(live, int(token[0]), record)

    def _read_step(self, tokens, active, lives, logprobs) -> None:
        tokens, active = host_array(tokens), host_array(active)
        records = [None] * len(lives)
        if logprobs is not None:
            records = host_rows(tuple(host_array(a) for a in logprobs), tokens,
                                [None if x is None else x.request.logprobs for x in lives],
                                [RAW if x is None else MODES.index(x.request.logprobs_mode) for x in lives])
        for row, live in enumerate(lives):
            if live is not None and active[row] and not live.finished and live.decoding:
                self._push(live, int(tokens[row]), records[row])

    def _push(self, live: Live, token: int, logprob=None) -> None:
        """One generated token of ``live`` (with its ``TokenLogprob`` when the request asks for one): its text to
        the caller, its constraint's matcher fed; the end of the answer frees the slot."""
        if live.finished:
            return
        live.generated += 1
        if logprob is not None:
            live.token_logprobs.append(logprob)
        live.handle._emit(TokenEvent(token, live.answer.push(token), logprob))
        if live.matcher is not None and not live.answer.done:
            if not live.matcher.consume_token(token):  # the mask allowed it: cannot happen
                self.slots.release(live.slot)
                self._end(live, None, error=RuntimeError(f"engine error: the constraint refused token {token}: "
                                                         f"{live.matcher.get_error()}"))
                return
            if live.matcher.is_stopped():  # complete: nothing but an end id could follow
                live.answer.end()
        if live.answer.done or live.generated >= live.request.max_new_tokens:
            if live.answer.finish_reason == "stop":
                self.slots.release(live.slot)  # the device does not know stop strings: it may still be active
            elif self.prefix.enabled and not live.request.whole_prompt:  # the device ended it (end id or last
                # token): its row holds the whole turn
                self._keep_turn(live)
            self._end(live, None)

    def _keep_turn(self, live: Live) -> None:
        """A prefix entry of the prompt and answer (all but the last token, which is not in the cache)."""
        answer = np.asarray(live.answer.token_ids[:-1], np.int64)
        length = len(live.ids) + len(answer)
        if len(answer) and length >= MIN_PREFIX_TOKENS:
            live.ids = np.concatenate([live.ids, answer])
            self._keep_prefix(live, length, None)

    def _end(self, live: Live, reason: str | None, error: BaseException | None = None) -> None:
        """Finish ``live`` (reason "cancelled", or None: its answer's own reason) and free its slot."""
        if live.finished:
            return
        live.finished = True
        if live in self._waiting:
            self._waiting.remove(live)
        if live.slot is not None and self._slot_of[live.slot] is live:
            self._slot_of[live.slot] = None
            self.slots.pages.give_back(live.slot)
        if error is not None:
            self.stats.failed += 1
            live.handle._finish(None, error)
            return
        rest = live.answer.finish()
        if rest:
            live.handle._emit(TokenEvent(None, rest))
        reason = reason or live.answer.finish_reason
        now = time.perf_counter()
        prompt_tokens = len(live.request.prompt.token_ids)
        self.stats.finished[reason] += 1
        self.stats.prompt_tokens += prompt_tokens
        self.stats.cached_tokens += live.cached
        self.stats.generated_tokens += live.generated
        live.handle._finish(GenerationResult(
            text=live.answer.text, token_ids=live.answer.token_ids, prompt_tokens=prompt_tokens,
            finish_reason=reason, seconds=now - live.handle.submitted, cached_tokens=live.cached,
            first_token_seconds=None if live.first_token is None else live.first_token - live.handle.submitted,
            **live.scores.result(live.request, self.engine.cfg.decoder.vocab_size),
            logprobs=live.token_logprobs if live.request.logprobs is not None else None))

