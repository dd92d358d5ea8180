"""Qwen3-Omni prompts: chat template, image / audio pads expanded per item, 3-D MRoPE positions.

Images: resized and cut into merge-block ordered patches (preprocess/qwen3_omni/image.py), t*h*w / merge**2 soft
tokens per image of patch grid (t, h, w). Videos (preprocess/qwen3_omni/video.py): frames sampled and cut into
temporal patches the same way, their sound (unless the part says ``"use_audio_in_video": False``) joining the audio
clips where the video stands and interleaved with its frames in the prompt. Audio clips (16 kHz mono, at most ``max_audio_seconds``): Whisper log-mel
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
from omnijax.preprocess.qwen3_omni.mrope import MRopeMedia, MRopeTokens, audio_tokens_from_frames, mrope_positions
from omnijax.preprocess.qwen3_omni.video import QwenVideoConfig, seconds_per_grid, video_patches, video_replacement
from omnijax.preprocess.request_limits import check_media_tokens
from omnijax.preprocess.tokenizer import load_tokenizer
from omnijax.preprocess.video_source import load_video, load_video_parts

DEFAULT_MAX_AUDIO_SECONDS = 1200.0


class Qwen3OmniProcessor(Processor):
    """image_token_id, audio_token_id: the model's placeholder ids; thinker_config: the thinker's config.json section
    (the MRoPE token ids and constants); vision, audio: the towers' input layouts; max_audio_seconds: the longest
    clip accepted (default 1200 s); video_size: whose frame size bounds videos take, "processor" (default: what
    transformers' processor gives them) or "checkpoint" (the saved video processor's; see
    preprocess/qwen3_omni/video.py)."""

    roles = ("system", "user", "assistant", "tool")  # the roles its chat template knows
    tool_format = "hermes"  # how its model writes tool calls (app/tools.py)

    def __init__(self, folder: pathlib.Path, *, image_token_id: int, audio_token_id: int, thinker_config: dict,
                 vision: image_batch.VisionInput, audio: audio_batch.AudioInput,
                 max_audio_seconds: float | None = None, video_token_id: int | None = None,
                 video_size: str = "processor"):
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
        self.video_cfg = QwenVideoConfig.from_folder(folder, self.image_cfg, video_size)
        self.video_token = inv.get(video_token_id) if video_token_id is not None else None
        self.tokens = {"video": self.video_token, "audio": self.audio_token,
                       "audio_start": inv.get(th["audio_start_token_id"]),
                       "audio_end": inv.get(th.get("audio_end_token_id", vocab.get("<|audio_end|>")))}
        markers = [self.image_token, self.audio_token] + ([self.video_token] if self.video_token else [])
        self.split = re.compile("(" + "|".join(re.escape(m) for m in markers) + ")")
        # the batches' bounds: the biggest resized image and the longest accepted clip
        max_pixels = self.image_cfg.max_pixels
        if max_pixels < (vision.patch_size * vision.merge_size) ** 2:
            raise ValueError(f"max_pixels {max_pixels} is smaller than one merge block of patches")
        max_frames = math.ceil(self.max_audio_seconds * self.audio_cfg.sampling_rate / self.audio_cfg.hop_length) + 1
        modalities = {
            "image": Modality(image_token_id, self.process_images,
                              functools.partial(image_batch.collate, vision=vision, max_pixels=max_pixels)),
            "audio": Modality(audio_token_id, self.process_clips,
                              functools.partial(audio_batch.collate, audio=audio, max_frames=max_frames),
                              independent=False,  # the clips of a prompt are padded to the longest
                              tokens_for_seconds=self.fewest_audio_tokens)}
        if self.video_token is not None:
            if None in self.tokens.values():
                raise CheckpointError("the tokenizer lacks <|audio_start|> / <|audio_end|>, which videos need")
            modalities["video"] = Modality(video_token_id, self.process_videos, functools.partial(
                image_batch.collate, vision=vision, max_pixels=max(max_pixels, self.video_cfg.pixels.max_pixels)))
        super().__init__(tokenizer, modalities)

    def process_images(self, sources: list) -> MediaItems:
        """{"patches": [t*h*w, C*T*p*p], "grid": (t, h, w)} per image; t*h*w / merge**2 soft tokens; the layout
        is the grid."""
        pixels, grid_thw = process_images([load_image(s) for s in sources], self.image_cfg)
        starts = np.cumsum([0] + [int(np.prod(g)) for g in grid_thw])
        grids = [tuple(int(v) for v in g) for g in grid_thw]
        merge = self.image_cfg.merge_size ** 2
        return MediaItems([{"patches": pixels[starts[i]:starts[i + 1]], "grid": grids[i]} for i in range(len(grids))],
                          [int(np.prod(g)) // merge for g in grids], grids)

    def fewest_audio_tokens(self, seconds: float) -> int:
        """The fewest soft tokens a clip of ``seconds`` takes (its mel frames rounded down)."""
        frames = int(seconds * self.audio_cfg.sampling_rate) // self.audio_cfg.hop_length
        return int(audio_tokens_from_frames(max(frames, 1), self.n_window))

    def process_clips(self, sources: list) -> MediaItems:
        """{"features": [n_mels, frames]} per clip (its valid frames); the soft-token count is also the layout."""
        clips = [load_audio(s, max_seconds=self.max_audio_seconds) for s in sources]
        feats, mask = batch_features(clips, self.audio_cfg)
        frames = [int(m.sum()) for m in mask]
        tokens = [int(audio_tokens_from_frames(f, self.n_window)) for f in frames]
        return MediaItems([{"features": feats[i][:, :frames[i]]} for i in range(len(clips))], tokens, tokens)

    # ---- videos --------------------------------------------------------------------------------------------

    def load_media(self, messages: list[dict]) -> list[dict]:
        """Video parts -> loaded videos (preprocess/video_source.py), with their sound unless a part says
        ``"use_audio_in_video": False``."""
        p = self.video_cfg.pixels
        return load_video_parts(messages, lambda part: load_video(
            part, sample=self.video_cfg.frame_indices, target_size=self.video_cfg.target_size, resample=p.resample,
            with_audio=True, max_audio_seconds=self.max_audio_seconds))

    def process_media(self, messages: list[dict]) -> dict[str, MediaItems]:
        """As the base class, but a video's sound joins the audio clips where the video stands (the order its
        audio tokens take in the prompt)."""
        sources = {"image": [], "audio": [], "video": []}
        in_video = []
        for message in messages:
            for part in message["content"]:
                kind = part["type"]
                if kind == "text":
                    continue
                value = part.get(kind) if part.get(kind) is not None else part.get("path", part.get("url"))
                sources[kind].append(value)
                if kind == "audio":
                    in_video.append(False)
                elif kind == "video" and value.audio is not None:
                    sources["audio"].append(value.audio)
                    in_video.append(True)
        media = {m: self.modalities[m].process(sources[m]) for m in ("image", "audio", "video") if sources[m]}
        count = sum(len(found) for found in sources.values())
        check_media_tokens(sum(sum(items.tokens) for items in media.values()), self.budget, count, count)
        if "audio" in media:  # layouts: None for a video's sound (its video expands it), else the token count
            items = media["audio"]
            media["audio"] = MediaItems(items.inputs, items.tokens,
                                        [None if v else n for v, n in zip(in_video, items.tokens)])
        if "video" in media:
            sound = iter(n for v, n in zip(in_video, media["audio"].tokens if "audio" in media else []) if v)
            items = media["video"]
            media["video"] = MediaItems(items.inputs, items.tokens, [
                (grid, seconds, next(sound) if has_audio else None)
                for grid, seconds, has_audio in items.layouts])
        return media

    def process_videos(self, videos: list) -> MediaItems:
        """{"patches": [t*h*w, C*T*p*p], "grid": (t, h, w)} per loaded video (the image items' layout); the
        layout is (grid, seconds per temporal patch, whether it has sound); t*h*w / merge**2 soft tokens."""
        p = self.video_cfg.pixels
        inputs, tokens, layouts = [], [], []
        for video in videos:
            patches, grid = video_patches(video.frames, p)
            inputs.append({"patches": patches, "grid": grid})
            tokens.append(int(np.prod(grid)) // p.merge_size ** 2)
            layouts.append((grid, seconds_per_grid(video, p.temporal_patch_size), video.audio is not None))
        return MediaItems(inputs, tokens, layouts)

    # ---- prompt ---------------------------------------------------------------------------------------------

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        layouts = {m: media[m].layouts if m in media else [] for m in ("image", "audio", "video")}
        standalone = [n for n in layouts["audio"] if n is not None]
        pieces = self.split.split(text)
        markers = pieces[1::2]
        found = [markers.count(t) if t else 0 for t in (self.image_token, self.audio_token, self.video_token)]
        wanted = [len(layouts["image"]), len(standalone), len(layouts["video"])]
        if found != wanted:
            raise PromptError(f"the prompt has {found[0]} image, {found[1]} audio and {found[2]} video placeholders "
                              f"for {wanted[0]} images, {wanted[1]} audio clips and {wanted[2]} videos")
        merge = self.image_cfg.merge_size
        runs = {self.image_token: iter(self.image_token * (int(np.prod(g)) // merge ** 2) for g in layouts["image"]),
                self.audio_token: iter(self.audio_token * n for n in standalone),
                self.video_token: iter(video_replacement(g, s, n, self.mrope.position_id_per_seconds,
                                                         self.video_cfg.pixels.merge_size, self.tokens)
                                       for g, s, n in layouts["video"])}
        out = [pieces[0]]
        for marker, rest in zip(pieces[1::2], pieces[2::2]):
            out += [next(runs[marker]), rest]
        return "".join(out)

    def finish(self, ids: np.ndarray, media: dict[str, MediaItems]) -> dict:
        grids = media["image"].layouts if "image" in media else []
        audio_tokens = media["audio"].tokens if "audio" in media else []
        videos = [(g, s) for g, s, _ in media["video"].layouts] if "video" in media else []
        positions, delta = mrope_positions(ids, image_grids=grids, audio_lengths=audio_tokens, videos=videos,
                                           cfg=self.mrope)
        return {"rope_positions": positions, "rope_delta": delta,
                "rope_media": MRopeMedia(tuple(grids), tuple(audio_tokens), tuple(videos))}
