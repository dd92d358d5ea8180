"""Host-side batching of Qwen3-Omni audio clips for the audio encoder (encoders/qwen3_omni/audio_encoder.py):
attention-window blocks, in numpy.

The reference cuts each clip into chunks of 2 * n_window frames (the last one shorter) and restricts attention to
windows of whole chunks of one clip (``cu_seqlens``; :func:`audio_windows`). :func:`collate` lays the clips out as
window blocks (:func:`audio_window_blocks`): one block per attention window of every clip, the window count rounded
up to a length bucket (powers of two and their 1.5x midpoints) and the chunks per block to a power of two (at most
``chunks_per_window``, n_window_infer // (2 * n_window)). Frame counts and the batch's longest chunk are data, so
clips of new lengths inside a bucket reuse the compiled program.

The encoder's inputs (B window blocks of U chunk slots, M mel bins; letters as in encoders/__init__.py)::

    "features"       [B, U, M, 2*n_window] float32   each chunk's frames, zeros after them and in empty slots
    "chunk_frames"   [B, U] int32                    frames of each chunk, 0 for an empty slot
    "padded_frames"  [] int32                        the batch's longest chunk (the reference pads to it)

Token counts per clip or chunk: ``preprocess.qwen3_omni.mrope.audio_tokens_from_frames``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.buckets import length_bucket, pow2_at_least
from omnijax.preprocess.qwen3_omni.mrope import audio_tokens_from_frames


@dataclasses.dataclass(frozen=True)
class AudioInput:
    """The audio tower's input layout, from its config: mel bins per frame, half the chunk length in frames
    (``n_window``) and the attention window length in frames (``n_window_infer``)."""

    num_mel_bins: int
    n_window: int
    n_window_infer: int

    @property
    def chunks_per_window(self) -> int:
        """The most chunks one attention window covers."""
        return self.n_window_infer // (2 * self.n_window)


def audio_chunk_lengths(lengths: tuple[int, ...], n_window: int) -> tuple[int, ...]:
    """Frames of every chunk of every clip, in order: full chunks of 2 * n_window frames, then the remainder
    (``chunk_and_pad_features``)."""
    chunk = 2 * n_window
    out: list[int] = []
    for n in lengths:
        out += [chunk] * (n // chunk)
        if n % chunk:
            out.append(n % chunk)
    return tuple(out)


def audio_attention_seqlens(lengths: tuple[int, ...], n_window: int, n_window_infer: int) -> tuple[int, ...]:
    """Attention window lengths in tokens, in order (``get_audio_cu_seqlens`` differenced): each clip's tokens are
    cut into windows of ``max_chunk_tokens * (n_window_infer // (2 * n_window))`` tokens, the last one shorter,
    where ``max_chunk_tokens`` is the most tokens any chunk of the batch yields."""
    chunk_tokens = [audio_tokens_from_frames(c, n_window) for c in audio_chunk_lengths(lengths, n_window)]
    window = max(chunk_tokens) * (n_window_infer // (2 * n_window))
    if window < 1:
        raise ValueError(f"audio attention window is empty (n_window {n_window}, n_window_infer {n_window_infer})")
    out: list[int] = []
    for n in lengths:
        tokens = audio_tokens_from_frames(n, n_window)
        out += [window] * (tokens // window)
        if tokens % window:
            out.append(tokens % window)
    return tuple(out)


def audio_windows(lengths: tuple[int, ...], n_window: int, n_window_infer: int) -> tuple[tuple[int, ...], ...]:
    """The reference's attention windows (:func:`audio_attention_seqlens`) as runs of chunks: window i holds the
    indices, into ``audio_chunk_lengths(lengths, n_window)``, of the chunks whose tokens it covers. Raises
    ValueError if a window would end inside a chunk."""
    tokens = [audio_tokens_from_frames(c, n_window) for c in audio_chunk_lengths(lengths, n_window)]
    windows: list[tuple[int, ...]] = []
    c = 0
    for size in audio_attention_seqlens(lengths, n_window, n_window_infer):
        run, covered = [], 0
        while covered < size:
            covered += tokens[c]
            run.append(c)
            c += 1
        if covered != size:
            raise ValueError(f"an audio attention window of {size} tokens ends inside a chunk (lengths {lengths})")
        windows.append(tuple(run))
    return tuple(windows)


def audio_window_blocks(lengths: tuple[int, ...], n_window: int, windows: tuple[tuple[int, ...], ...],
                        num_blocks: int, chunks_per_block: int) -> dict:
    """Window-block layout of clips of ``lengths`` frames packed back to back: window i (:func:`audio_windows`)
    fills block i of [num_blocks, chunks_per_block] chunk slots with its chunks, then empty slots.

    Returns numpy arrays:
      source [num_blocks, chunks_per_block, 2 * n_window] int32: index of each slot's frame in the packed
          [n_mels, total_frames] input, ``total_frames`` past a chunk's end and in empty slots;
      chunk_frames [num_blocks, chunks_per_block] int32: frames of each chunk, 0 for an empty slot;
      padded_frames [] int32: the longest chunk of the batch, the length the reference pads every chunk to.
    """
    chunks = audio_chunk_lengths(lengths, n_window)
    if len(windows) > num_blocks or max(len(w) for w in windows) > chunks_per_block:
        raise ValueError(f"{len(windows)} audio windows of up to {max(len(w) for w in windows)} chunks do not fit "
                         f"{num_blocks} blocks of {chunks_per_block} chunks")
    total, width = sum(chunks), 2 * n_window
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    source = np.full((num_blocks, chunks_per_block, width), total, np.int32)
    frames = np.zeros((num_blocks, chunks_per_block), np.int32)
    for i, run in enumerate(windows):
        for j, c in enumerate(run):
            source[i, j, :chunks[c]] = starts[c] + np.arange(chunks[c])
            frames[i, j] = chunks[c]
    return dict(source=source, chunk_frames=frames, padded_frames=np.int32(max(chunks)))


def collate(items: list[dict], audio: AudioInput, max_frames: int) -> dict[str, np.ndarray]:
    """The processor's audio items ({"features": [n_mels, frames]}) -> the encoder's inputs (module docstring).
    Raises MediaError, before any device work, for a malformed item or a clip longer than ``max_frames`` frames."""
    if not items:
        raise ValueError("no audio clips to collate")
    lengths, packed = [], []
    for i, item in enumerate(items):
        feats = np.asarray(item.get("features") if isinstance(item, dict) else None)
        if feats.ndim != 2 or feats.shape[0] != audio.num_mel_bins:
            raise MediaError(f"audio clip {i}: expected log-mel features [{audio.num_mel_bins}, frames], got "
                             f"{feats.shape}")
        if feats.shape[1] < 1:
            raise MediaError(f"audio clip {i} has no feature frames")
        if feats.shape[1] > max_frames:
            raise MediaError(f"audio clip {i} has {feats.shape[1]} feature frames, more than the limit of "
                             f"{max_frames}")
        lengths.append(int(feats.shape[1]))
        packed.append(feats.astype(np.float32, copy=False))
    lengths = tuple(lengths)
    windows = audio_windows(lengths, audio.n_window, audio.n_window_infer)
    per_block = min(audio.chunks_per_window, pow2_at_least(max(len(w) for w in windows)))
    blocks = audio_window_blocks(lengths, audio.n_window, windows, length_bucket(len(windows)), per_block)
    packed.append(np.zeros((audio.num_mel_bins, 1), np.float32))
    frames = np.concatenate(packed, axis=1)[:, blocks["source"]]  # [M, B, U, 2*n_window]
    return {"features": np.ascontiguousarray(np.transpose(frames, (1, 2, 0, 3))),
            "chunk_frames": blocks["chunk_frames"], "padded_frames": blocks["padded_frames"]}
