"""Qwen3-Omni prompts: chat template, image / audio pads expanded per item, 3-D MRoPE positions.

Images: resized and cut into merge-block ordered patches (preprocess/qwen3_omni/image.py), t*h*w / merge**2 soft
tokens per image of patch grid (t, h, w). Audio clips (16 kHz mono, at most ``max_audio_seconds``): Whisper log-mel
features (preprocess/qwen3_omni/audio_features.py), their token count from the frames
(preprocess/qwen3_omni/mrope.py). The chat template writes one ``<|image_pad|>`` / ``<|audio_pad|>`` per part; the
i-th becomes the item's run of that pad. Positions: ``mrope_positions`` (preprocess/qwen3_omni/mrope.py). Batching:
preprocess/qwen3_omni/image_batch.py and audio_batch.py, bounded by the largest resized image and the longest clip.
"""

from __future__ import annotations

import functools
import math
import pathlib
import re

import numpy as np

from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.images import load_image
from omnijax.preprocess.processor import MediaItems, Modality, Processor
from omnijax.preprocess.qwen3_omni import audio_batch, image_batch
from omnijax.preprocess.qwen3_omni.audio_features import WhisperFeatureConfig, batch_features
from omnijax.preprocess.qwen3_omni.image import QwenImageConfig, process_images
from omnijax.preprocess.qwen3_omni.mrope import MRopeTokens, audio_tokens_from_frames, mrope_positions
from omnijax.preprocess.tokenizer import load_tokenizer

DEFAULT_MAX_AUDIO_SECONDS = 1200.0


class Qwen3OmniProcessor(Processor):
    """image_token_id, audio_token_id: the model's placeholder ids; thinker_config: the thinker's config.json section
    (the MRoPE token ids and constants); vision, audio: the towers' input layouts; max_audio_seconds: the longest
    clip accepted (default 1200 s)."""

    roles = ("system", "user", "assistant", "tool")  # the roles its chat template knows

    def __init__(self, folder: pathlib.Path, *, image_token_id: int, audio_token_id: int, thinker_config: dict,
                 vision: image_batch.VisionInput, audio: audio_batch.AudioInput,
                 max_audio_seconds: float | None = None):
        tokenizer = load_tokenizer(folder)
        self.image_cfg = QwenImageConfig.from_folder(folder)
        self.audio_cfg = WhisperFeatureConfig.from_folder(folder)
        self.n_window = audio.n_window
        self.max_audio_seconds = DEFAULT_MAX_AUDIO_SECONDS if max_audio_seconds is None else max_audio_seconds
        vocab = tokenizer.get_vocab()
        inv = {v: k for k, v in vocab.items()}
        for name, tid in (("image", image_token_id), ("audio", audio_token_id)):
            if tid not in inv:
                raise CheckpointError(f"{name} token id {tid} is not in the tokenizer's vocabulary")
        self.image_token, self.audio_token = inv[image_token_id], inv[audio_token_id]
        th = dict(thinker_config)
        th.setdefault("vision_start_token_id", vocab.get("<|vision_start|>"))
        th.setdefault("audio_start_token_id", vocab.get("<|audio_start|>"))
        th.setdefault("video_token_id", vocab.get("<|video_pad|>", -1))
        self.mrope = MRopeTokens.from_thinker_config(th)
        self.split = re.compile(f"({re.escape(self.image_token)}|{re.escape(self.audio_token)})")
        # the batches' bounds: the biggest resized image and the longest accepted clip
        max_pixels = self.image_cfg.max_pixels
        if max_pixels < (vision.patch_size * vision.merge_size) ** 2:
            raise ValueError(f"max_pixels {max_pixels} is smaller than one merge block of patches")
        max_frames = math.ceil(self.max_audio_seconds * self.audio_cfg.sampling_rate / self.audio_cfg.hop_length) + 1
        super().__init__(tokenizer, {
            "image": Modality(image_token_id, self.process_images,
                              functools.partial(image_batch.collate, vision=vision, max_pixels=max_pixels)),
            "audio": Modality(audio_token_id, self.process_clips,
                              functools.partial(audio_batch.collate, audio=audio, max_frames=max_frames),
                              independent=False)})  # the clips of a prompt are padded to the longest

    def process_images(self, sources: list) -> MediaItems:
        """{"patches": [t*h*w, C*T*p*p], "grid": (t, h, w)} per image; t*h*w / merge**2 soft tokens; the layout
        is the grid."""
        pixels, grid_thw = process_images([load_image(s) for s in sources], self.image_cfg)
        starts = np.cumsum([0] + [int(np.prod(g)) for g in grid_thw])
        grids = [tuple(int(v) for v in g) for g in grid_thw]
        merge = self.image_cfg.merge_size ** 2
        return MediaItems([{"patches": pixels[starts[i]:starts[i + 1]], "grid": grids[i]} for i in range(len(grids))],
                          [int(np.prod(g)) // merge for g in grids], grids)

    def process_clips(self, sources: list) -> MediaItems:
        """{"features": [n_mels, frames]} per clip (its valid frames); the soft-token count is also the layout."""
        clips = [load_audio(s, max_seconds=self.max_audio_seconds) for s in sources]
        feats, mask = batch_features(clips, self.audio_cfg)
        frames = [int(m.sum()) for m in mask]
        tokens = [int(audio_tokens_from_frames(f, self.n_window)) for f in frames]
        return MediaItems([{"features": feats[i][:, :frames[i]]} for i in range(len(clips))], tokens, tokens)

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        tokens = {m: media[m].tokens if m in media else [] for m in ("image", "audio")}
        pieces = self.split.split(text)
        markers = pieces[1::2]
        n_img, n_aud = markers.count(self.image_token), markers.count(self.audio_token)
        if n_img != len(tokens["image"]) or n_aud != len(tokens["audio"]):
            raise PromptError(f"the prompt has {n_img} image and {n_aud} audio placeholders for "
                              f"{len(tokens['image'])} images and {len(tokens['audio'])} audio clips")
        runs = {self.image_token: iter(tokens["image"]), self.audio_token: iter(tokens["audio"])}
        out = [pieces[0]]
        for marker, rest in zip(pieces[1::2], pieces[2::2]):
            out += [marker * next(runs[marker]), rest]
        return "".join(out)

    def finish(self, ids: np.ndarray, media: dict[str, MediaItems]) -> dict:
        grids = media["image"].layouts if "image" in media else []
        audio_tokens = media["audio"].tokens if "audio" in media else []
        positions, delta = mrope_positions(ids, image_grids=grids, audio_lengths=audio_tokens, cfg=self.mrope)
        return {"rope_positions": positions.astype(np.int32), "rope_delta": int(delta)}
