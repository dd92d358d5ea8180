"""Qwen3-Omni 3-D (temporal, height, width) MRoPE position ids, the same as transformers' ``get_rope_index``.

Reference: ``Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index`` in ``modeling_qwen3_omni_moe.py``.
For one prompt (padding removed), walking the tokens left to right with a running position p (starting at 0):

* a text token (anything outside a media block, including the ``<|vision_end|>`` / ``<|audio_end|>`` closing a
  block) gets (p, p, p), then p += 1;
* ``<|vision_start|>`` followed by ``t * h * w / merge**2`` image tokens (grid (t, h, w) in patches): the start
  token gets (p, p, p); the image tokens, in merged-grid order (frame, row, column), get
  (p + 1 + frame * position_id_per_seconds, p + 1 + row, p + 1 + column) over the merged grid of
  ``h / merge`` x ``w / merge``; then p = (largest of those values) + 1;
* ``<|audio_start|>`` followed by n audio tokens: all sequential, like text.

The rope delta of a prompt of n tokens is ``max(positions) + 1 - n``. Generated token j (0-based) then takes
position ``n + j + delta`` on all three axes, i.e. one more than the last prompt position (the prompt ends in
text), which is what transformers' generation does (it adds 1 per step to the last prompt position).

Videos (``<|video_pad|>``) take the image layout with temporal positions ``t * seconds_per_grid *
position_id_per_seconds`` (float32, possibly fractional); a video with its sound (``<|vision_start|><|audio_start|>``
...) merges the video's positions with the sound's sequential ones by temporal position. Positions are float32,
computed in the reference's order of float32 operations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from omnijax.common.errors import CheckpointError, PromptError


@dataclasses.dataclass(frozen=True)
class MRopeTokens:
    """Token ids and constants ``get_rope_index`` reads from a Qwen3-Omni thinker config.

    image_token_id, audio_token_id, video_token_id: the ``<|image_pad|>``, ``<|audio_pad|>``, ``<|video_pad|>`` ids.
    vision_start_token_id, audio_start_token_id: ``<|vision_start|>`` and ``<|audio_start|>``.
    spatial_merge_size: ``vision_config.spatial_merge_size`` (patches merged per side into one token).
    position_id_per_seconds: temporal position step per second (per frame of an image grid; 25 by default,
        13 in Qwen3-Omni checkpoints). Only grids with t > 1 use it.
    """

    image_token_id: int
    audio_token_id: int
    video_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    spatial_merge_size: int = 2
    position_id_per_seconds: float = 25

    @classmethod
    def from_thinker_config(cls, d: dict[str, Any], source: str = "thinker config") -> "MRopeTokens":
        """From a thinker config dict (the ``"thinker_config"`` section of a Qwen3-Omni ``config.json``, or a
        thinker-only ``config.json``). The token ids are required; ``spatial_merge_size`` comes from
        ``vision_config`` (default 2), ``position_id_per_seconds`` defaults to 25 like the transformers config.
        Raises ``CheckpointError`` naming the missing or malformed key.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        kwargs: dict[str, Any] = {}
        for key in ("image_token_id", "audio_token_id", "video_token_id", "vision_start_token_id",
                    "audio_start_token_id"):
            value = d.get(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise CheckpointError(f"{source}: '{key}' must be an integer token id, got {value!r}")
            kwargs[key] = value
        vision = d.get("vision_config") or {}
        merge = vision.get("spatial_merge_size", 2) if isinstance(vision, dict) else 2
        if isinstance(merge, bool) or not isinstance(merge, int) or merge <= 0:
            raise CheckpointError(f"{source}: 'vision_config.spatial_merge_size' must be a positive int, got {merge!r}")
        per_second = d.get("position_id_per_seconds", 25)
        if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) or per_second < 0:
            raise CheckpointError(f"{source}: 'position_id_per_seconds' must be a number >= 0, got {per_second!r}")
        return cls(spatial_merge_size=merge, position_id_per_seconds=per_second, **kwargs)


def audio_tokens_from_frames(num_frames, n_window: int = 50):
    """Audio placeholder tokens for ``num_frames`` mel frames (an int or an int array of them).

    transformers' ``_get_feat_extract_output_lengths``: full chunks of ``2 * n_window`` frames give 13 tokens
    each, the remainder goes through three stride-2 convolutions. ``get_rope_index`` takes frame counts
    (``feature_attention_mask.sum(-1)``) and applies this itself; :func:`mrope_positions` takes the result.
    """
    frames = np.asarray(num_frames, dtype=np.int64)
    chunk = n_window * 2
    leave = frames % chunk
    feat = (leave - 1) // 2 + 1
    tokens = ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13
    return int(tokens) if tokens.ndim == 0 else tokens


def _run_length(ids: np.ndarray, start: int, token: int) -> int:
    """How many consecutive ``token`` ids ``ids`` holds from index ``start``."""
    rest = ids[start:] != token
    return int(np.argmax(rest)) if rest.any() else len(ids) - start


_WHAT = {"image": "grids", "audio": "lengths", "video": "videos"}


def _f32(x) -> np.float32:
    return np.float32(x)


def _arange(n: int, start) -> np.ndarray:
    """float32 [3, n]: ``torch.arange(n).expand(3, -1) + start`` (one float32 addition per value)."""
    return np.broadcast_to(np.arange(n, dtype=np.float32) + _f32(start), (3, n))


def _vision_block(grid_thw, t_index: np.ndarray, cfg: MRopeTokens, start) -> np.ndarray:
    """float32 [3, t * h * w / merge**2]: ``get_llm_pos_ids_for_vision`` (t_index float32 [t]) plus ``start``."""
    t, h, w = (int(v) for v in grid_thw)
    merge = cfg.spatial_merge_size
    if min(t, h, w) <= 0 or h % merge or w % merge:
        raise PromptError(
            f"image grid (t, h, w) = {(t, h, w)} is not usable: all must be positive and h, w multiples of the "
            f"spatial merge size {merge}"
        )
    gh, gw = h // merge, w // merge
    t_pos = np.repeat(t_index.astype(np.float32), gh * gw)
    h_pos = np.tile(np.repeat(np.arange(gh, dtype=np.float32), gw), t)
    w_pos = np.tile(np.arange(gw, dtype=np.float32), t * gh)
    return np.stack([t_pos, h_pos, w_pos]) + _f32(start)


def video_time_index(t: int, seconds_per_grid: float, cfg: MRopeTokens) -> np.ndarray:
    """float32 [t]: ``arange(t) * float32(seconds_per_grid) * position_id_per_seconds`` in float32, the temporal
    positions of a video's frame groups."""
    return (np.arange(t, dtype=np.float32) * _f32(seconds_per_grid)) * _f32(cfg.position_id_per_seconds)


def _interleave(video: np.ndarray, audio: np.ndarray) -> list[np.ndarray]:
    """The reference's merge of a video's and its sound's positions by their temporal position (ties: video)."""
    chunks, v, a = [], 0, 0
    while v < video.shape[1] and a < audio.shape[1]:
        if video[0, v] <= audio[0, a]:
            chunks.append(video[:, v:v + 1])
            v += 1
        else:
            chunks.append(audio[:, a:a + 1])
            a += 1
    if v < video.shape[1]:
        chunks.append(video[:, v:])
    if a < audio.shape[1]:
        chunks.append(audio[:, a:])
    return chunks


@dataclasses.dataclass(frozen=True)
class MRopeMedia:
    """What a prompt's 3-D positions are computed from besides its token ids, in prompt order (the arguments of
    :func:`mrope_positions`): image grids, audio token counts (a video's sound where its video is) and videos as
    (grid, seconds per temporal patch)."""

    image_grids: tuple = ()
    audio_lengths: tuple = ()
    videos: tuple = ()

    def blocks(self, ids: np.ndarray, cfg: "MRopeTokens") -> list[tuple[int, str, Any]]:
        """(start index, kind, its value here) of each media item, in prompt order, from the blocks' start tokens
        in ``ids`` (a video with its sound gives a "video" and an "audio" item at the same start). PromptError when
        the blocks and the items do not match."""
        items = {"image": iter(self.image_grids), "audio": iter(self.audio_lengths), "video": iter(self.videos)}
        out = []

        def take(kind: str, start: int) -> None:
            value = next(items[kind], None)
            if value is None:
                raise PromptError(f"the prompt holds more {kind} blocks than the {kind} items given")
            out.append((start, kind, value))

        ids = np.asarray(ids)
        for i in np.nonzero((ids == cfg.vision_start_token_id) | (ids == cfg.audio_start_token_id))[0]:
            i = int(i)
            following = int(ids[i + 1]) if i + 1 < len(ids) else None
            if ids[i] == cfg.vision_start_token_id:
                if following == cfg.image_token_id:
                    take("image", i)
                elif following in (cfg.video_token_id, cfg.audio_start_token_id):
                    take("video", i)
                    if following == cfg.audio_start_token_id:
                        take("audio", i)
            elif following == cfg.audio_token_id and not (i and ids[i - 1] == cfg.vision_start_token_id):
                take("audio", i)
        if any(next(rest, None) is not None for rest in items.values()):
            raise PromptError("the prompt holds fewer media blocks than the media items given")
        return out

    def kept(self, ids: np.ndarray, cfg: "MRopeTokens", keep: np.ndarray) -> "MRopeMedia":
        """The items whose blocks start where ``keep`` [len(ids)] is True."""
        chosen = {"image": [], "audio": [], "video": []}
        for start, kind, value in self.blocks(ids, cfg):
            if keep[start]:
                chosen[kind].append(value)
        return MRopeMedia(tuple(chosen["image"]), tuple(chosen["audio"]), tuple(chosen["video"]))


def mrope_positions(
    input_ids: np.ndarray,
    *,
    image_grids: Sequence[Sequence[int]] = (),
    audio_lengths: Sequence[int] = (),
    videos: Sequence[tuple[Sequence[int], float]] = (),
    cfg: MRopeTokens,
) -> tuple[np.ndarray, float]:
    """3-D positions of one prompt: (positions float32 [3, seq], rope delta).

    input_ids: int [seq], the prompt without padding. Images appear as ``<|vision_start|>`` + image tokens,
        audios as ``<|audio_start|>`` + audio tokens, videos as ``<|vision_start|>`` + video tokens, a video with
        its sound as ``<|vision_start|><|audio_start|>`` + video and audio tokens interleaved (then normally the end
        tokens, which count as text).
    image_grids: one (t, h, w) per image, in prompt order, in patches (the processor's ``image_grid_thw``).
    audio_lengths: one count per audio block, in prompt order (a video's sound counts where its video is), in
        AUDIO TOKENS (placeholders), not mel frames: convert frame counts with :func:`audio_tokens_from_frames`
        exactly once.
    videos: one ((t, h, w), seconds per temporal patch) per video, in prompt order.

    The reference's walk, block by block and in its float32 arithmetic (a video's temporal positions may be
    fractional): text runs continue from the previous chunk's largest position + 1; a block's start token(s)
    follow; image tokens take (start + t * position_id_per_seconds, start + row, start + column), video tokens
    the same with ``video_time_index``; a video's sound tokens take start + k and are merged with its video
    tokens by temporal position. Raises ``PromptError`` when the media blocks do not match the grids / lengths.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 1:
        raise PromptError(f"mrope_positions expects token ids [seq], got shape {tuple(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer) and ids.size:
        raise PromptError(f"token ids must be integers, got dtype {ids.dtype}")
    n = len(ids)
    if n == 0:
        raise PromptError("cannot compute positions of an empty prompt")
    merge2 = cfg.spatial_merge_size**2
    media_tokens = {cfg.image_token_id: "image", cfg.audio_token_id: "audio", cfg.video_token_id: "video"}
    chunks: list[np.ndarray] = []
    counts = {"image": 0, "audio": 0, "video": 0}
    given = {"image": len(image_grids), "audio": len(audio_lengths), "video": len(videos)}

    def take(kind: str) -> int:
        if counts[kind] >= given[kind]:
            raise PromptError(f"prompt holds more {kind} blocks than the {given[kind]} {kind} {_WHAT[kind]} given")
        counts[kind] += 1
        return counts[kind] - 1

    def next_start():
        return chunks[-1].max() + _f32(1) if chunks else _f32(0)

    def check_run(start: int, token: int, length: int, what: str) -> None:
        run = _run_length(ids, start, token)
        if run != length:
            raise PromptError(f"{what}, the prompt holds {run} at index {start}")

    st, i = 0, 0
    while i < n:
        token = int(ids[i])
        following = int(ids[i + 1]) if i + 1 < n else None
        block = None
        if token == cfg.vision_start_token_id:
            if following == cfg.image_token_id:
                block = "image"
            elif following == cfg.video_token_id:
                block = "video"
            elif following == cfg.audio_start_token_id:
                block = "video_audio"
            else:
                raise PromptError(f"vision start token at index {i} is not followed by image tokens")
        elif token == cfg.audio_start_token_id:
            if following != cfg.audio_token_id:
                raise PromptError(f"audio start token at index {i} is not followed by audio tokens")
            block = "audio"
        elif token in media_tokens:
            raise PromptError(
                f"{media_tokens[token]} placeholder token {token} at index {i} is not inside a media block (it must "
                "follow its start token)"
            )
        if block is None:
            i += 1
            continue
        st_idx = next_start()
        if i > st:
            chunks.append(_arange(i - st, st_idx))
            st_idx = _f32(st_idx + _f32(i - st))
        bos = 2 if block == "video_audio" else 1
        chunks.append(_arange(bos, st_idx))
        st_idx = _f32(st_idx + _f32(bos))
        body = i + bos
        if block == "audio":
            k = take("audio")
            length = int(audio_lengths[k])
            check_run(body, cfg.audio_token_id, length, f"audio {k}: expected {length} audio tokens")
            chunks.append(_arange(length, st_idx))
        elif block == "image":
            k = take("image")
            grid = tuple(int(v) for v in image_grids[k])
            t_index = (np.arange(grid[0], dtype=np.float32) * _f32(cfg.position_id_per_seconds))
            positions = _vision_block(grid, t_index, cfg, st_idx)
            length = positions.shape[1]
            run = _run_length(ids, body, cfg.image_token_id)
            if run != length:
                raise PromptError(f"image {k}: grid {grid} needs {length} image tokens (t*h*w/{merge2}), the prompt "
                                  f"holds {run} at index {body}")
            chunks.append(positions)
        else:
            k = take("video")
            grid, seconds = tuple(int(v) for v in videos[k][0]), float(videos[k][1])
            positions = _vision_block(grid, video_time_index(grid[0], seconds, cfg), cfg, st_idx)
            length = positions.shape[1]
            if block == "video":
                check_run(body, cfg.video_token_id, length, f"video {k}: grid {grid} needs {length} video tokens")
            else:
                a = take("audio")
                sound = int(audio_lengths[a])
                inside = ids[body:body + length + sound]
                found = (int((inside == cfg.video_token_id).sum()), int((inside == cfg.audio_token_id).sum()))
                if found != (length, sound):
                    raise PromptError(f"video {k} with its sound: expected {length} video and {sound} audio tokens "
                                      f"at index {body}, the prompt holds {found[0]} and {found[1]}")
                # chunk by chunk: the block's end token continues from its last chunk, as in the reference
                chunks.extend(_interleave(positions, _arange(sound, st_idx)))
                length += sound
            if block == "video":
                chunks.append(positions)
        end = body + length + bos
        if end > n:
            raise PromptError(f"the {block} block at index {i} has no end token")
        chunks.append(_arange(bos, next_start()))
        st = i = end
    for kind in counts:
        if counts[kind] != given[kind]:
            raise PromptError(f"{given[kind]} {kind} {_WHAT[kind]} given but the prompt holds {counts[kind]} {kind} "
                              f"blocks")
    if st < n:
        chunks.append(_arange(n - st, next_start()))
    positions = np.concatenate(chunks, axis=1)
    delta = positions.max() + _f32(1) - _f32(n)
    return positions, float(delta)


def mrope_positions_batch(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    *,
    image_grids: Sequence[Sequence[Sequence[int]]] | None = None,
    audio_lengths: Sequence[Sequence[int]] | None = None,
    cfg: MRopeTokens,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of a padded batch: (positions int64 [3, batch, seq], deltas int64 [batch]).

    input_ids, attention_mask: [batch, seq]; mask 1 marks real tokens (left padding, or any pattern: the real
    tokens of a row are taken in order, as the reference does). image_grids / audio_lengths: per row, the grids
    and the audio token counts (tokens, not frames) of that row's media, as for :func:`mrope_positions`.

    Padding positions are what the reference writes there: 0 when the batch holds an image (its multimodal
    branch), else 1 (its text branch, ``cumsum - 1`` filled with 1). Deltas are ``max(row positions) + 1 - n``
    over each row's real tokens. The reference's text branch takes that max over the padding too, so for a padded
    row of a single real token in an image-free batch it reports delta 1, not 0; generation never uses that value
    (it continues from the last prompt position + 1, which is ``n + delta`` here).
    """
    ids = np.asarray(input_ids)
    mask = np.asarray(attention_mask)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise PromptError(
            f"expected input_ids and attention_mask of one shape [batch, seq], got {tuple(ids.shape)} and "
            f"{tuple(mask.shape)}"
        )
    batch, seq = ids.shape
    image_grids = [() for _ in range(batch)] if image_grids is None else list(image_grids)
    audio_lengths = [() for _ in range(batch)] if audio_lengths is None else list(audio_lengths)
    if len(image_grids) != batch or len(audio_lengths) != batch:
        raise PromptError(
            f"need one list of image grids and one of audio lengths per row ({batch} rows), got "
            f"{len(image_grids)} and {len(audio_lengths)}"
        )
    has_images = any(len(grids) > 0 for grids in image_grids)
    positions = np.full((3, batch, seq), 0 if has_images else 1, dtype=np.int64)
    deltas = np.zeros(batch, dtype=np.int64)
    for row in range(batch):
        real = mask[row] == 1
        try:
            row_positions, deltas[row] = mrope_positions(
                ids[row][real], image_grids=image_grids[row], audio_lengths=audio_lengths[row], cfg=cfg
            )
        except PromptError as exc:
            raise PromptError(f"batch row {row}: {exc}") from exc
        positions[:, row, real] = row_positions
    return positions, deltas
