"""Gemma 4 prompts: the chat template, images and audio clips turned into encoder inputs, placeholders expanded.

Per conversation (what ``Gemma4Processor`` of transformers produces, checked by tests/test_gemma4_parity.py):

- images (a path, PIL image or array; preprocess.images.load_image) -> preprocess.gemma4.image.process_image with
  the folder's image processor settings: unpadded patches, positions and the soft-token count n;
- audio clips (a path or ``(array, sample_rate)``, resampled to 16 kHz mono; preprocess.audio) -> the log-mel frames
  of preprocess.gemma4.audio_features (the clip's valid frames) and m = ceil(ceil(frames / 2) / 2) tokens. The
  reference cuts every clip to its first 30 s (480 000 samples) without a word; here a longer clip is refused with a
  ``MediaError`` naming the limit (``max_audio_seconds`` may lower it, not raise it);
- the chat template writes one ``<|image|>`` / ``<|audio|>`` marker per part; each becomes ``<|image>`` +
  ``<|image|>`` x n + ``<image|>`` / ``<|audio>`` + ``<|audio|>`` x m + ``<audio|>`` (preprocess.gemma4.prompt);
- token ids without added special tokens (the template writes ``<bos>``); ``bidirectional`` marks the ``<|image|>``
  tokens when the checkpoint's decoder lets image blocks attend both ways (``use_bidirectional_attention``
  "vision"); audio tokens never do.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from omnijax.app.families.spec import ModelConfig, PreparedPrompt
from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.gemma4.audio_batch import collate as collate_clips
from omnijax.preprocess.gemma4.image_batch import collate_smallest_budget
from omnijax.preprocess.gemma4.audio_features import Gemma4AudioFeatureConfig, load_clip_features, tokens_from_frames
from omnijax.preprocess.gemma4.image import Gemma4ImageConfig, process_image
from omnijax.preprocess.gemma4.prompt import Gemma4MediaTokens, expand_placeholders
from omnijax.preprocess.images import load_image
from omnijax.preprocess.prompts import media_of, normalize_messages, render_chat
from omnijax.preprocess.tokenizer import load_tokenizer
from omnijax.preprocess.user_text import encode_prompt


class Gemma4Processor:
    def __init__(self, folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None):
        self.tokenizer = load_tokenizer(folder)
        self.collate: dict = {}
        self.tokens = Gemma4MediaTokens.from_tokenizer(self.tokenizer)
        self.modalities = cfg.modalities
        self.token_ids = {m: cfg.media_token_id(m) for m in self.modalities}
        vocab = self.tokenizer.get_vocab()
        markers = {"image": (self.tokens.image_token, self.tokens.boi_token, self.tokens.eoi_token),
                   "audio": (self.tokens.audio_token, self.tokens.boa_token, self.tokens.eoa_token)}
        for modality in self.modalities:
            for token in markers[modality]:
                if token not in vocab:
                    raise CheckpointError(f"the tokenizer has no {token!r} token")
            if vocab[markers[modality][0]] != self.token_ids[modality]:
                raise CheckpointError(f"the tokenizer's {markers[modality][0]!r} is id {vocab[markers[modality][0]]} "
                                      f"but config.json names {self.token_ids[modality]} for {modality}")
        self.image_cfg = self.audio_cfg = None
        if "image" in self.modalities:
            self.image_cfg = Gemma4ImageConfig.from_folder(folder)
            self.collate["image"] = functools.partial(collate_smallest_budget, image_cfg=self.image_cfg)
        self.max_audio_seconds = None
        if "audio" in self.modalities:
            self.audio_cfg = Gemma4AudioFeatureConfig.from_folder(folder)
            if max_audio_seconds is not None and not max_audio_seconds > 0:
                raise ValueError(f"max_audio_seconds must be positive, got {max_audio_seconds!r}")
            self.max_audio_seconds = self.audio_cfg.max_seconds if max_audio_seconds is None else \
                min(float(max_audio_seconds), self.audio_cfg.max_seconds)
            self.collate["audio"] = collate_clips
        self.bidirectional = any(layer.attention.mask.media_bidirectional for layer in cfg.decoder.layers)

    def prepare(self, messages) -> PreparedPrompt:
        messages = normalize_messages(messages)
        sources = {m: media_of(messages, m) for m in ("image", "audio")}
        for modality, items in sources.items():
            if items and modality not in self.modalities:
                raise PromptError(f"this Gemma 4 checkpoint takes no {modality} input")
        images = [process_image(load_image(source), self.image_cfg) for source in sources["image"]]
        clips = [load_clip_features(source, self.audio_cfg, max_seconds=self.max_audio_seconds)
                 for source in sources["audio"]]
        image_counts = [item.num_soft_tokens for item in images]
        audio_counts = [tokens_from_frames(len(frames)) for frames in clips]
        text = expand_placeholders(render_chat(self.tokenizer, messages), image_counts, audio_counts, self.tokens)
        ids = encode_prompt(self.tokenizer, text)
        for modality, counts in (("image", image_counts), ("audio", audio_counts)):
            if modality in self.modalities and int((ids == self.token_ids[modality]).sum()) != sum(counts):
                raise PromptError(f"the prompt holds {int((ids == self.token_ids[modality]).sum())} {modality} "
                                  f"tokens for {len(counts)} {modality} items of {sum(counts)} tokens in all")
        media = {k: v for k, v in (("image", images), ("audio", clips)) if v}
        bidirectional = (ids == self.token_ids["image"]) if self.bidirectional and "image" in self.modalities \
            else np.zeros(len(ids), bool)
        return PreparedPrompt(token_ids=ids, media=media, bidirectional=bidirectional)

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
