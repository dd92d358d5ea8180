"""The processor every family shares: chat messages -> a ``PreparedPrompt``, generated token ids -> text.

``Processor.prepare`` does what every family does, in this order:

1. normalise the messages (preprocess/prompts.py) and refuse media of a modality the checkpoint does not take
   (before reading any of it);
2. read the media a family reads ahead (``load_media``: videos, whose sound track may become an audio part), then
   turn each modality's media sources (paths, PIL images, arrays, loaded videos, ...) into encoder inputs and
   soft-token counts: the family's ``Modality.process`` (``process_media``);
3. render the chat template with user text escaped (``render_chat``);
4. expand the template's media markers into soft-token runs: the family's ``expand``;
5. tokenize (``encode_prompt``, preprocess/user_text.py) and check that the placeholder tokens of every modality are
   exactly its items' soft tokens;
6. mark the soft tokens of modalities whose blocks attend both ways (``Modality.bidirectional``) and add the
   family's extra outputs (``finish``: e.g. 3-D MRoPE positions).

A family's processor (preprocess/<family>/processor.py; the text-only one is preprocess/text_processor.py) is a
subclass that reads its settings from the checkpoint folder, takes what it needs from the model config as plain
values (placeholder ids, tokens per image, the encoders' input layouts, ...), and fills in those hooks. ``collate``
holds its host-side batching per modality: media items of a batch -> the encoder's bucketed input arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from omnijax.common.errors import PromptError
from omnijax.preprocess import tool_prompt
from omnijax.preprocess.prompts import DEFAULT_ROLES, MEDIA_TYPES, media_of, normalize_messages, render_chat, tool_texts
from omnijax.preprocess.request_limits import RequestBudget, check_media_budget, check_media_tokens, check_text_size
from omnijax.preprocess.user_text import encode_prompt

# How refusals and checks name the items of each modality.
PLURALS = {"image": "images", "audio": "audio clips", "video": "videos"}


@dataclasses.dataclass
class PreparedPrompt:
    """One conversation ready for the model.

    token_ids: [seq] int32 with media placeholders already expanded.
    media: modality -> encoder inputs, one per media item in order of appearance (e.g. pixel values [3, H, W]
        per image or crop); the processor's ``collate`` of the modality batches them.
    bidirectional: [seq] bool, True for tokens that attend to their whole block both ways (media soft tokens).
    rope_positions: [axes, seq] float32 RoPE positions when they are not 0..seq-1 (e.g. 3-D MRoPE positions, whose
        temporal ones may be fractional for videos).
    rope_delta: added to the sequence position of every generated token to get its RoPE position.
    rope_media: what ``rope_positions`` were computed from besides the token ids (a family's own record, e.g. the
        media grids, for positions of another sequence built from this prompt); None when nothing.
    """

    token_ids: np.ndarray
    media: dict[str, list]
    bidirectional: np.ndarray
    rope_positions: np.ndarray | None = None
    rope_delta: float = 0
    rope_media: Any = None


@dataclasses.dataclass(frozen=True)
class MediaItems:
    """One modality's media of a prompt, processed.

    inputs: encoder inputs in order, one or more per source item (an image and its pan-and-scan crops, ...): what
        ``PreparedPrompt.media`` holds and ``collate`` batches.
    tokens: the soft tokens of each source item (the length of its placeholder run).
    layouts: per source item, what expanding its marker needs (crop count, tile grid, patch grid, ...).
    """

    inputs: list
    tokens: list[int]
    layouts: list

    @staticmethod
    def joined(items: list["MediaItems"]) -> "MediaItems":
        """The items of several ``MediaItems`` in order, as one."""
        return MediaItems([x for i in items for x in i.inputs], [x for i in items for x in i.tokens],
                          [x for i in items for x in i.layouts])


@dataclasses.dataclass(frozen=True)
class Modality:
    """How a family reads one modality.

    token_id: the placeholder id its soft tokens take in the token ids.
    process: the modality's media sources of one prompt, in order -> MediaItems (MediaError for unreadable media).
    collate: encoder inputs of a batch (``MediaItems.inputs`` of its prompts) -> the encoder's input arrays.
    bidirectional: its soft tokens attend their whole block both ways.
    independent: ``process`` of several items gives what it gives for each alone, one after the other (False when
        items are padded to the longest of the prompt): then items are processed one at a time, and the rest is
        not decoded once the prompt's media are over the context budget.
    tokens_for_seconds: (audio) the fewest soft tokens a clip of so many seconds takes, when it follows from the
        length alone: a prompt whose clips cannot fit the context is refused from their headers, before decoding.
    """

    token_id: int
    process: Callable[[list], MediaItems]
    collate: Callable[[list], dict[str, np.ndarray]]
    bidirectional: bool = False
    independent: bool = True
    tokens_for_seconds: Callable[[float], int] | None = None


def refusal(kind: str, count: int, accepted: tuple[str, ...]) -> str:
    """The message refusing ``count`` media parts of ``kind`` on a checkpoint that takes ``accepted`` media."""
    held = f"(the messages hold {count} {kind} part(s))"
    if not accepted:
        return f"this checkpoint is text-only: it takes text only, no {kind} input {held}"
    return f"this checkpoint takes no {kind} input, only text and {' and '.join(PLURALS[m] for m in accepted)} {held}"


class Processor:
    """Chat messages -> PreparedPrompt through ``tokenizer``'s chat template; ``modalities``: the media the
    checkpoint takes ({} for a text-only one). Subclasses override ``expand`` and ``finish`` (module docstring).

    roles: the message roles the family's chat template knows; any other is refused (PromptError).
    tool_format: how the family's model writes tool calls (app/tools.py's formats): "hermes", "gemma4",
        "llama4", or "prompt" for a chat template without tool support (the tools and calls are written as text by
        preprocess/tool_prompt.py before the template renders the conversation).
    budget: the limits of one request (preprocess/request_limits.py); the pipeline sets its context budget.
    """

    roles: tuple[str, ...] = DEFAULT_ROLES
    tool_format: str = "prompt"

    def __init__(self, tokenizer, modalities: dict[str, Modality] | None = None):
        self.tokenizer = tokenizer
        self.modalities = dict(modalities or {})
        self.budget = RequestBudget()

    @property
    def collate(self) -> dict[str, Callable[[list], dict[str, np.ndarray]]]:
        """Host-side batching per modality: media items of a batch -> the encoder's bucketed input arrays."""
        return {m: modality.collate for m, modality in self.modalities.items()}

    def prepare(self, messages: Any, tools: list[dict] | None = None) -> PreparedPrompt:
        """``tools``: OpenAI's tool dicts the model may call (given to the chat template, or written into the
        conversation by the prompt format)."""
        if self.tool_format == "prompt":
            messages, tools = tool_prompt.rewrite(messages, tools), None
        messages = normalize_messages(messages, self.roles)
        check_text_size([p["text"] for m in messages for p in m["content"] if p["type"] == "text"]
                        + tool_texts(messages, tools), self.budget.max_text_bytes, "the conversation")
        sources = {kind: media_of(messages, kind) for kind in MEDIA_TYPES}
        for kind, found in sources.items():
            if found and kind not in self.modalities:
                raise PromptError(refusal(kind, len(found), tuple(self.modalities)))
        audio = self.modalities.get("audio")
        check_media_budget(sources, self.budget, frozenset(m for m, modality in self.modalities.items()
                                                           if not modality.independent),
                           audio.tokens_for_seconds if audio is not None else None)
        messages = self.load_media(messages)
        media = self.process_media(messages)
        ids = encode_prompt(self.tokenizer, self.expand(render_chat(self.tokenizer, messages, tools=tools), media))
        for m, modality in self.modalities.items():
            check_soft_tokens(ids, m, modality.token_id, media.get(m))
        soft = [modality.token_id for modality in self.modalities.values() if modality.bidirectional]
        return PreparedPrompt(token_ids=ids, media={m: items.inputs for m, items in media.items()},
                              bidirectional=np.isin(ids, soft), **self.finish(ids, media))

    def process_media(self, messages: list[dict]) -> dict[str, MediaItems]:
        """{modality: its items} for the media of ``messages``: each modality's sources in order of appearance
        through its ``process``; independent items one at a time, refusing the prompt as soon as its media alone
        are over the context budget."""
        sources = {kind: media_of(messages, kind) for kind in MEDIA_TYPES}
        media: dict[str, MediaItems] = {}
        tokens, done, total = 0, 0, sum(len(found) for found in sources.values())
        for m in MEDIA_TYPES:
            if not sources[m]:
                continue
            modality = self.modalities[m]
            groups = [[source] for source in sources[m]] if modality.independent else [sources[m]]
            parts = []
            for group in groups:
                parts.append(modality.process(group))
                tokens, done = tokens + sum(parts[-1].tokens), done + len(group)
                check_media_tokens(tokens, self.budget, done, total)
            media[m] = parts[0] if len(parts) == 1 else MediaItems.joined(parts)
        return media

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # ---- hooks -----------------------------------------------------------------------------------------------

    def load_media(self, messages: list[dict]) -> list[dict]:
        """The messages with media a family reads ahead of the rest (videos: frames and sound track), possibly
        with parts added (a video's sound as an audio part). The base class reads nothing ahead."""
        return messages

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        """The rendered prompt with each media marker replaced by its item's soft-token run (PromptError when the
        markers do not match the items). The base class has no media: the text is returned as it is."""
        return text

    def finish(self, ids: np.ndarray, media: dict[str, MediaItems]) -> dict:
        """Extra ``PreparedPrompt`` fields for the token ids [seq] (``rope_positions``, ``rope_delta``)."""
        return {}


def check_soft_tokens(ids: np.ndarray, modality: str, token_id: int, items: MediaItems | None) -> None:
    """PromptError unless ``ids`` hold exactly as many ``token_id`` placeholders as the items' soft tokens."""
    counts = items.tokens if items is not None else []
    found = int((ids == token_id).sum())
    if found != sum(counts):
        raise PromptError(f"the prompt holds {found} {modality} tokens for {len(counts)} {PLURALS[modality]} of "
                          f"{sum(counts)} tokens in all")
