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
- token ids without added special tokens (the template writes ``<bos>``); the ``<|image|>`` tokens attend their
  block both ways when the checkpoint's decoder lets image blocks do so (``use_bidirectional_attention``
  "vision"); audio tokens never do.

Batching: preprocess/gemma4/image_batch.py (at the smallest soft-token budget holding the batch's images) and
preprocess/gemma4/audio_batch.py.
"""

from __future__ import annotations

import pathlib

from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.gemma4 import audio_batch
from omnijax.preprocess.gemma4.audio_features import Gemma4AudioFeatureConfig, load_clip_features, tokens_from_frames
from omnijax.preprocess.gemma4.image import Gemma4ImageConfig, process_image
from omnijax.preprocess.gemma4.image_batch import collate_smallest_budget
from omnijax.preprocess.gemma4.prompt import Gemma4MediaTokens, expand_placeholders
from omnijax.preprocess.gemma4.video import Gemma4VideoConfig, frame_patches, video_replacement
from omnijax.preprocess.images import load_image
from omnijax.preprocess.processor import MediaItems, Modality, Processor
from omnijax.preprocess.tokenizer import load_tokenizer
from omnijax.preprocess.video_source import load_video, load_video_parts


class Gemma4Processor(Processor):
    """token_ids: {modality: placeholder id} of the media the checkpoint takes ("image", "audio"; {} for a text-only
    checkpoint); image_bidirectional: image soft tokens attend their block both ways; max_audio_seconds: the longest
    clip accepted (at most the feature extractor's 30 s)."""

    roles = ("system", "developer", "user", "assistant", "tool")  # the roles its chat template knows
    tool_format = "gemma4"  # how its model writes tool calls (app/tools.py)

    def __init__(self, folder: pathlib.Path, *, token_ids: dict[str, int], image_bidirectional: bool = False,
                 max_audio_seconds: float | None = None):
        tokenizer = load_tokenizer(folder)
        self.tokens = Gemma4MediaTokens.from_tokenizer(tokenizer)
        vocab = tokenizer.get_vocab()
        video_token = getattr(tokenizer, "video_token", None) or "<|video|>"
        self.video_token = video_token
        markers = {"image": (self.tokens.image_token, self.tokens.boi_token, self.tokens.eoi_token),
                   "audio": (self.tokens.audio_token, self.tokens.boa_token, self.tokens.eoa_token),
                   "video": (video_token, self.tokens.boi_token, self.tokens.eoi_token)}
        for modality, token_id in token_ids.items():
            for token in markers[modality]:
                if token not in vocab:
                    raise CheckpointError(f"the tokenizer has no {token!r} token")
            if vocab[markers[modality][0]] != token_id:
                raise CheckpointError(f"the tokenizer's {markers[modality][0]!r} is id {vocab[markers[modality][0]]} "
                                      f"but config.json names {token_id} for {modality}")
        modalities = {}
        self.image_cfg = self.audio_cfg = self.max_audio_seconds = self.video_cfg = None
        if "image" in token_ids:
            self.image_cfg = Gemma4ImageConfig.from_folder(folder)
            modalities["image"] = Modality(token_ids["image"], self.process_images, self.collate_images,
                                           bidirectional=image_bidirectional)
        if "audio" in token_ids:
            self.audio_cfg = Gemma4AudioFeatureConfig.from_folder(folder)
            if max_audio_seconds is not None and not max_audio_seconds > 0:
                raise ValueError(f"max_audio_seconds must be positive, got {max_audio_seconds!r}")
            self.max_audio_seconds = self.audio_cfg.max_seconds if max_audio_seconds is None else \
                min(float(max_audio_seconds), self.audio_cfg.max_seconds)
            modalities["audio"] = Modality(token_ids["audio"], self.process_clips, audio_batch.collate)
        if "video" in token_ids:
            self.video_cfg = Gemma4VideoConfig.from_folder(folder)
            modalities["video"] = Modality(token_ids["video"], self.process_videos, self.collate_frames,
                                           bidirectional=image_bidirectional)
        super().__init__(tokenizer, modalities)

    def load_media(self, messages: list[dict]) -> list[dict]:
        """Video parts -> loaded videos; on a checkpoint with an audio tower, a file's audio track (or an array's
        ``"audio"``) becomes an audio part right after its video, unless the part says
        ``"use_audio_in_video": False``."""
        if self.video_cfg is None:
            return messages
        sound = self.audio_cfg is not None
        return load_video_parts(messages, lambda part: load_video(
            part, sample=self.video_cfg.frame_indices, target_size=self.video_cfg.target_size,
            resample=self.video_cfg.pixels.resample, with_audio=sound,
            max_audio_seconds=self.max_audio_seconds if sound else 0.0), sound_as_audio_part=sound)

    def process_videos(self, videos: list) -> MediaItems:
        """The frames of every video as image items (``Gemma4ImagePatches``); a video's soft tokens are its
        frames' together, its layout (frame timestamps, soft tokens a frame)."""
        inputs, tokens, layouts = [], [], []
        for video in videos:
            frames = frame_patches(video, self.video_cfg.pixels)
            inputs += frames
            tokens.append(sum(f.num_soft_tokens for f in frames))
            layouts.append((video.sampled.timestamps, frames[0].num_soft_tokens))
        return MediaItems(inputs, tokens, layouts)

    def collate_frames(self, items: list) -> dict:
        """Video frames batched as images, at the smallest soft-token budget holding them."""
        return collate_smallest_budget(items, self.video_cfg.pixels)

    def process_images(self, sources: list) -> MediaItems:
        """Unpadded patches per image (``Gemma4ImagePatches``), its soft-token count."""
        images = [process_image(load_image(source), self.image_cfg) for source in sources]
        counts = [item.num_soft_tokens for item in images]
        return MediaItems(images, counts, counts)

    def collate_images(self, items: list) -> dict:
        """The images at the smallest supported soft-token budget that holds them (preprocess/gemma4/image_batch.py)."""
        return collate_smallest_budget(items, self.image_cfg)

    def process_clips(self, sources: list) -> MediaItems:
        """Log-mel frames [frames, mels] per clip, ceil(ceil(frames / 2) / 2) soft tokens."""
        clips = [load_clip_features(source, self.audio_cfg, max_seconds=self.max_audio_seconds) for source in sources]
        counts = [tokens_from_frames(len(frames)) for frames in clips]
        return MediaItems(clips, counts, counts)

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        counts = {m: media[m].layouts if m in media else [] for m in ("image", "audio")}
        text = expand_placeholders(text, counts["image"], counts["audio"], self.tokens)
        videos = media["video"].layouts if "video" in media else []
        pieces = text.split(self.video_token)
        if len(pieces) - 1 != len(videos):
            raise PromptError(f"the prompt has {len(pieces) - 1} {self.video_token} markers but {len(videos)} videos "
                              f"were given")
        out = [pieces[0]]
        for (timestamps, per_frame), rest in zip(videos, pieces[1:]):
            out += [video_replacement(timestamps, per_frame, self.tokens.boi_token, self.video_token,
                                      self.tokens.eoi_token), rest]
        return "".join(out)
