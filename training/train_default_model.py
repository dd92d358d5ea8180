"""Train the embedded default model (app/checkpoints/shapes-gemma3) from scratch on procedurally drawn scenes.

    pip install -e ".[train]"
    python training/train_default_model.py --out app/checkpoints/shapes-gemma3

A Gemma 3-architecture model (SigLIP-style vision tower, Gemma 3 projector, Gemma 3 decoder with sliding and global
layers and bidirectional image blocks), built with this package's own modules (app.model.MultimodalModel through
the gemma3 family spec) and trained with optax on conversations about pictures of shapes (training/scenes.py,
training/dialogues.py), with the loss on the answer tokens only. Two training aids are dropped at the end: for the
first ``--curriculum`` steps most pictures hold one shape, and linear heads on the image's soft tokens predict
what the scene holds (per picture: background, counts; per soft token: the kind and colour of the shape in its
cell), which teaches the vision tower long before the answers alone would. The result is written as an ordinary
Hugging Face checkpoint folder (transformers' Gemma3ForConditionalGeneration loads it): config.json,
generation_config.json, model.safetensors (float32), the tokenizer (training/tokenizer.py), the Gemma 3 chat
template and the processor settings.

Reproducible: every random draw comes from ``--seed`` (the model's initialisation, and each step's data from
``numpy.random.default_rng([seed, step])``); the same command on the same software gives the same weights (XLA's CPU
results can differ across machines and versions in the last bits). Run time of the default recipe on a 2-core CPU
(2 shared cores, float32): see README.md ("The embedded default model").
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import pathlib
import queue
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from omnijax.app.checkpoint_export import checkpoint_tensors  # noqa: E402
from omnijax.app.families.gemma3 import spec as gemma3  # noqa: E402
from omnijax.app.model import MultimodalModel  # noqa: E402
from training.dialogues import sample_conversation  # noqa: E402
from training.gemma3_weights import gemma3_weight_shapes, save_weights  # noqa: E402
from training.scenes import (BACKGROUNDS, COLOURS, KINDS, MAX_SHAPES, render_file_like, sample_scene,  # noqa: E402
                              shape_map)
from training.model import CONFIG, IMAGE_SIZE, MM_TOKENS, write_folder_files  # noqa: E402
from training.tokenizer import special_token_ids  # noqa: E402
from omnijax.decoder.model import Media, Prompt  # noqa: E402
from omnijax.preprocess.gemma3.image import process_images  # noqa: E402

IDS = special_token_ids()

# Step kinds: (conversation kind, rows, padded length, image slots). Every fourth step is a "long" one.
STEP_KINDS = {"short": ("short", 32, 64, 32), "long": ("long", 12, 160, 36)}


def step_kind(step: int) -> str:
    return "long" if step % 4 == 3 else "short"


# ---------------------------------------------------------------------------------------------------------------
# Data


def answer_mask(ids: np.ndarray, model_prefix: list[int]) -> np.ndarray:
    """True at the tokens of every assistant answer (its text and its closing <end_of_turn>): the tokens after each
    ``<start_of_turn>model\\n`` up to and including the next <end_of_turn>."""
    mask = np.zeros(len(ids), bool)
    sot, eot = IDS["<start_of_turn>"], IDS["<end_of_turn>"]
    k = len(model_prefix)
    i = 0
    while i < len(ids):
        if ids[i] == sot and list(ids[i + 1:i + 1 + k]) == model_prefix:
            j = i + 1 + k
            while j < len(ids) and ids[j] != eot:
                mask[j] = True
                j += 1
            if j < len(ids):
                mask[j] = True
            i = j
        i += 1
    return mask


PAIRS = [(colour, kind) for colour in COLOURS for kind in KINDS]
NUM_PAIRS = len(PAIRS)


# Attribute heads of ``attribute_loss``: (classes, how many heads).
ATTRIBUTE_HEADS = [(len(BACKGROUNDS), 1), (MAX_SHAPES, 1), (MAX_SHAPES + 1, len(KINDS) + len(COLOURS) + NUM_PAIRS)]
NUM_ATTRIBUTES = sum(n for _, n in ATTRIBUTE_HEADS)
CELL_CLASSES = (len(KINDS) + 1, len(COLOURS) + 1)  # what a soft token's cell shows: kind or none, colour or none


def scene_attributes(scene) -> np.ndarray:
    """[NUM_ATTRIBUTES] int: background index, number of shapes - 1, then how many shapes of each kind, of each
    colour and of each (colour, kind)."""
    pairs = collections.Counter((s.colour, s.kind) for s in scene.shapes)
    kinds = collections.Counter(s.kind for s in scene.shapes)
    colours = collections.Counter(s.colour for s in scene.shapes)
    return np.array([list(BACKGROUNDS).index(scene.background), len(scene.shapes) - 1]
                    + [kinds[k] for k in KINDS] + [colours[c] for c in COLOURS] + [pairs[p] for p in PAIRS], np.int32)


def cell_labels(scene) -> np.ndarray:
    """[soft tokens, 2] int: for the picture's cell under each soft token (row-major grid), the kind (1 + index,
    0 for none) and colour (1 + index, 0 for none) of the shape covering most of it."""
    which = shape_map(scene, math.isqrt(MM_TOKENS))
    out = np.zeros((len(which), 2), np.int32)
    for cell, index in enumerate(which):
        if index >= 0:
            shape = scene.shapes[index]
            out[cell] = (KINDS.index(shape.kind) + 1, list(COLOURS).index(shape.colour) + 1)
    return out


def warmup_scene(rng: np.random.Generator):
    """A scene of the first steps' curriculum: mostly one shape (1, 2, 3 shapes with probabilities .6, .3, .1),
    which ties each answer's colour and kind words to one shape."""
    return sample_scene(rng, num_shapes=int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1])))


class Batcher:
    """Training batches: conversations -> the pipeline's own prompt preparation -> padded arrays."""

    def __init__(self, processor, seed: int, curriculum_steps: int = 0):
        self.processor = processor
        self.seed = seed
        self.curriculum_steps = curriculum_steps
        self.model_prefix = processor.tokenizer("model\n", add_special_tokens=False)["input_ids"]
        # what the chat template appends after the last answer: the next generation prompt
        self.suffix = [IDS["<start_of_turn>"]] + self.model_prefix

    def example(self, rng: np.random.Generator, kind: str, max_len: int, new_scene):
        while True:
            conv = sample_conversation(rng, kind, new_scene)
            prompt = self.processor.prepare(conv.messages)
            ids = np.asarray(prompt.token_ids)
            assert list(ids[-len(self.suffix):]) == self.suffix
            ids = ids[:-len(self.suffix)]
            if len(ids) <= max_len:
                return ids, answer_mask(ids, self.model_prefix), prompt.media.get("image", []), conv.scenes

    def batch(self, step: int) -> dict:
        kind, rows, length, slots = STEP_KINDS[step_kind(step)]
        rng = np.random.default_rng([self.seed, step])
        new_scene = warmup_scene if step < self.curriculum_steps else sample_scene
        tokens = np.full((rows, length), IDS["<pad>"], np.int32)
        pos = np.full((rows, length), -1, np.int32)
        mask = np.zeros((rows, length), bool)
        pixels = np.zeros((slots, 3, IMAGE_SIZE, IMAGE_SIZE), np.float32)
        labels = np.full((slots, NUM_ATTRIBUTES), -1, np.int32)
        cells = np.full((slots, MM_TOKENS, 2), -1, np.int32)
        used = 0
        for r in range(rows):
            while True:
                ids, m, images, scenes = self.example(rng, kind, length, new_scene)
                if used + len(images) <= slots:
                    break
            n = len(ids)
            tokens[r, :n], pos[r, :n], mask[r, :n] = ids, np.arange(n), m
            for image, scene in zip(images, scenes, strict=True):
                pixels[used] = image
                labels[used] = scene_attributes(scene)
                cells[used] = cell_labels(scene)
                used += 1
        return {"kind": step_kind(step), "tokens": tokens, "pos": pos, "mask": mask, "pixels": pixels,
                "labels": labels, "cells": cells}


VISION_BATCH = 64  # pictures per step of the vision phase


def vision_batch(processor, seed: int, step: int) -> dict:
    """A step of the vision phase: VISION_BATCH new scenes (rendered as files are, ``render_file_like``), their
    pixels as the processor makes them, attribute and cell labels. Draws from ``default_rng([seed, 2, step])``,
    a stream apart from the conversation steps' ``[seed, step]``."""
    rng = np.random.default_rng([seed, 2, step])
    scenes = [sample_scene(rng) for _ in range(VISION_BATCH)]
    pixels, _ = process_images([render_file_like(s, rng) for s in scenes], processor.image_cfg)
    return {"pixels": pixels, "labels": np.stack([scene_attributes(s) for s in scenes]),
            "cells": np.stack([cell_labels(s) for s in scenes])}


def prefetch(make, start: int, stop: int, depth: int = 3):
    """Batches ``make(step)`` for steps start..stop-1, drawn in a background thread (the data of a step depends
    only on its index, so the thread changes nothing but the wall time)."""
    q: queue.Queue = queue.Queue(maxsize=depth)

    def work():
        for step in range(start, stop):
            q.put(make(step))
        q.put(None)

    threading.Thread(target=work, daemon=True).start()
    while (item := q.get()) is not None:
        yield item


# ---------------------------------------------------------------------------------------------------------------
# Model forward (teacher forcing)


def forward_logits(model: MultimodalModel, tokens_BL: jax.Array, seq_pos_BL: jax.Array,
                   pixels_NCHW: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits [B, L, V] at every position of right-padded token rows (seq_pos -1 at padding), image features
    [images * soft tokens, D]) through the model's own forward (``DecoderModel.prefill`` with every position's
    logits): token embeddings, image features merged at the image soft tokens (the
    j-th row of features at the j-th soft token, row-major over the batch), each image's soft tokens attending to
    each other both ways."""
    image_token = CONFIG["image_token_index"]
    feats = model.encoders["image"]({"pixels": pixels_NCHW,
                                     "image_valid": jnp.ones((pixels_NCHW.shape[0],), bool)}).features
    is_image = tokens_BL == image_token
    lengths = jnp.sum(seq_pos_BL >= 0, axis=1).astype(jnp.int32)
    prompt = Prompt(tokens_BL, lengths, jnp.maximum(seq_pos_BL, 0)[None], is_image, {image_token: Media(feats)})
    logits, _ = model.decoder.prefill(prompt, cache_len=tokens_BL.shape[1], cache_dtype=feats.dtype,
                                      all_logits=True)
    return logits, feats


def _column_losses(logits: jax.Array, labels: jax.Array, heads) -> jax.Array:
    """Cross-entropy of each label column [..., columns] under consecutive softmax heads (classes, count)."""
    out, start, column = [], 0, 0
    for classes, count in heads:
        for _ in range(count):
            out.append(optax.softmax_cross_entropy_with_integer_labels(logits[..., start:start + classes],
                                                                       jnp.maximum(labels[..., column], 0)))
            start, column = start + classes, column + 1
    return jnp.stack(out, axis=-1)


def _heads_loss(logits: jax.Array, labels: jax.Array, heads, valid: jax.Array) -> jax.Array:
    """Mean cross-entropy of consecutive softmax heads (classes, count) over the valid rows."""
    ce = _column_losses(logits, labels, heads).mean(axis=-1)
    return jnp.sum(ce * valid) / jnp.maximum(jnp.sum(valid), 1.0)


# The pooled attribute columns in groups (background, number of shapes, per-kind counts, per-colour counts,
# per-(colour, kind) counts): each group weighs the same, so the three kind columns are not drowned by the rest.
ATTRIBUTE_GROUPS = [(0, 1), (1, 2), (2, 2 + len(KINDS)), (2 + len(KINDS), 2 + len(KINDS) + len(COLOURS)),
                    (2 + len(KINDS) + len(COLOURS), 2 + len(KINDS) + len(COLOURS) + NUM_PAIRS)]


def _grouped_loss(logits: jax.Array, labels: jax.Array, valid: jax.Array) -> jax.Array:
    ce = _column_losses(logits, labels, ATTRIBUTE_HEADS)
    per_row = sum(ce[..., a:b].mean(axis=-1) for a, b in ATTRIBUTE_GROUPS) / len(ATTRIBUTE_GROUPS)
    return jnp.sum(per_row * valid) / jnp.maximum(jnp.sum(valid), 1.0)


def attribute_loss(aux: dict, feats_MD: jax.Array, labels_NA: jax.Array, cells_NT2: jax.Array) -> jax.Array:
    """Auxiliary losses that speed up the vision tower's start, through linear heads dropped after training: each
    image's soft tokens, averaged, predict its scene's attributes (``scene_attributes``, in equally weighted
    groups: ``ATTRIBUTE_GROUPS``), and each soft token predicts the kind and colour of the shape in its cell
    (``cell_labels``). labels_NA [images, attributes] and
    cells_NT2 [images, tokens, 2] are -1 for an empty image slot."""
    n = labels_NA.shape[0]
    tokens = feats_MD.reshape(n, -1, feats_MD.shape[-1])
    valid = (labels_NA[:, 0] >= 0).astype(jnp.float32)
    pooled = _grouped_loss(tokens.mean(axis=1) @ aux["kernel"] + aux["bias"], labels_NA, valid)
    per_token = tokens @ aux["cell_kernel"] + aux["cell_bias"]
    cells = _heads_loss(per_token, cells_NT2, [(c, 1) for c in CELL_CLASSES],
                        jnp.broadcast_to(valid[:, None], cells_NT2.shape[:2]))
    return pooled + cells


def loss_and_metrics(params, graphdef, batch, aux_weight):
    model = nnx.merge(graphdef, params["model"])
    logits, feats = forward_logits(model, batch["tokens"], batch["pos"], batch["pixels"])
    aux_loss = attribute_loss(params["aux"], feats, batch["labels"], batch["cells"])
    logits = logits[:, :-1]
    targets = batch["tokens"][:, 1:]
    mask = batch["mask"][:, 1:]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weight = mask.astype(jnp.float32)
    loss = jnp.sum(losses * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    correct = (jnp.argmax(logits, -1) == targets) | ~mask
    answers_ok = jnp.all(correct, axis=1)
    has_answer = jnp.any(mask, axis=1)
    exact = jnp.sum(answers_ok & has_answer) / jnp.maximum(jnp.sum(has_answer), 1)
    token_acc = jnp.sum((jnp.argmax(logits, -1) == targets) & mask) / jnp.maximum(jnp.sum(weight), 1.0)
    return loss + aux_weight * aux_loss, {"loss": loss, "aux": aux_loss, "token_acc": token_acc, "exact": exact}


def siglip_init(tower: dict, key: jax.Array) -> dict:
    """Draw the vision tower's matrices again the way SigLIP is initialised for training (in place; returns
    ``tower``): the patch embedding and position table normal with std 1/sqrt(fan in) and 1/sqrt(width), the
    attention and MLP matrices Glorot-uniform. With the small uniform draws of the inference modules the tower
    learns colours at once but tells circles, squares and triangles apart only slowly."""
    keys = iter(jax.random.split(key, 2 + 6 * len(tower["layers"])))
    kernel = tower["patch_embed"]["kernel"]  # [D, C*p*p]
    tower["patch_embed"]["kernel"] = jax.random.normal(next(keys), kernel.shape) * kernel.shape[1] ** -0.5
    table = tower["pos_embed"]  # [patches, D]
    tower["pos_embed"] = jax.random.normal(next(keys), table.shape) * table.shape[1] ** -0.5
    for layer in tower["layers"].values():
        for group, names in (("attn", ("q_proj", "k_proj", "v_proj", "out_proj")), ("mlp", ("fc1", "fc2"))):
            for name in names:
                w = layer[group][name]["kernel"]  # [out, in]
                limit = (6.0 / (w.shape[0] + w.shape[1])) ** 0.5
                layer[group][name]["kernel"] = jax.random.uniform(next(keys), w.shape, minval=-limit, maxval=limit)
    return tower


def vision_loss(trained, graphdef, frozen, batch):
    """The vision phase's loss: ``attribute_loss`` on the image features alone (``trained`` holds the encoders
    and the attribute heads; the decoder's parameters ``frozen`` are not used)."""
    model = nnx.merge(graphdef, {**frozen, "encoders": trained["encoders"]})
    n = batch["pixels"].shape[0]
    feats = model.encoders["image"]({"pixels": batch["pixels"], "image_valid": jnp.ones((n,), bool)}).features
    loss = attribute_loss(trained["aux"], feats, batch["labels"], batch["cells"])
    return loss, {"aux": loss}


def make_vision_step(graphdef, optimizer):
    @jax.jit
    def vision_step(trained, frozen, opt_state, batch):
        (_, metrics), grads = jax.value_and_grad(vision_loss, has_aux=True)(trained, graphdef, frozen, batch)
        updates, opt_state = optimizer.update(grads, opt_state, trained)
        return optax.apply_updates(trained, updates), opt_state, metrics

    return vision_step


def train_vision(params, graphdef, processor, args) -> dict:
    """The first ``--vision-steps`` steps: the vision tower, projector and attribute heads learn what the
    pictures hold (kinds, colours, counts, which shape each soft token shows) before any conversation; shapes'
    kinds are what a tower learns slowest, and a step here costs a fraction of a conversation step."""
    trained = {"encoders": params["model"]["encoders"], "aux": params["aux"]}
    frozen = {k: v for k, v in params["model"].items() if k != "encoders"}
    optimizer = make_optimizer(args.vision_steps, args.vision_lr, args.warmup)
    opt_state = optimizer.init(trained)
    step_fn = make_vision_step(graphdef, optimizer)
    start, losses = time.perf_counter(), []
    make = functools.partial(vision_batch, processor, args.seed)
    for step, batch in enumerate(prefetch(make, 0, args.vision_steps)):
        trained, opt_state, metrics = step_fn(trained, frozen, opt_state, batch)
        losses.append(float(metrics["aux"]))
        if (step + 1) % args.log_every == 0 or step + 1 == args.vision_steps:
            print(f"[vision] step {step + 1}/{args.vision_steps} {time.perf_counter() - start:.0f}s "
                  f"aux {np.mean(losses):.4f}", flush=True)
            losses = []
    return {"model": {**params["model"], "encoders": trained["encoders"]}, "aux": trained["aux"]}


def initial_params(cfg, seed: int):
    """The model's own random initialisation (``MultimodalModel`` with ``nnx.Rngs(seed)``), with two tables drawn
    again at unit scale: the token embeddings (std 1/sqrt(hidden), so that embeddings times Gemma's sqrt(hidden)
    have RMS ~1 like the post-normed layer outputs added to them) and the projector's matrix (std
    1/sqrt(vision hidden), so that soft tokens have RMS ~1 too), and the vision tower drawn as SigLIP is
    (``siglip_init``). Returns (graphdef, {"model": the model's parameters as a nested dict, "aux": the attribute
    head of ``attribute_loss``, zeros})."""
    model = MultimodalModel(cfg, gemma3.SPEC, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    k_embed, k_proj = jax.random.split(jax.random.key(seed + 1))
    table = params["decoder"]["embedder"]["embedding"]
    params["decoder"]["embedder"]["embedding"] = jax.random.normal(k_embed, table.shape) * table.shape[1] ** -0.5
    proj = params["encoders"]["image"]["projector"]
    w = proj["mm_input_projection_weight"]
    proj["mm_input_projection_weight"] = jax.random.normal(k_proj, w.shape) * w.shape[0] ** -0.5
    siglip_init(params["encoders"]["image"]["tower"], jax.random.key(seed + 2))
    width = cfg.decoder.hidden_size
    outputs = sum(classes * count for classes, count in ATTRIBUTE_HEADS)
    aux = {"kernel": jnp.zeros((width, outputs), jnp.float32), "bias": jnp.zeros((outputs,), jnp.float32),
           "cell_kernel": jnp.zeros((width, sum(CELL_CLASSES)), jnp.float32),
           "cell_bias": jnp.zeros((sum(CELL_CLASSES),), jnp.float32)}
    return graphdef, {"model": params, "aux": aux}


def make_optimizer(steps: int, peak_lr: float, warmup: int) -> optax.GradientTransformation:
    warmup = min(warmup, steps // 2)
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak_lr, warmup, max(steps, warmup + 1),
                                                  end_value=peak_lr * 0.05)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731 (no decay on norms, biases)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=0.01, mask=decay_mask))


def make_train_step(graphdef, optimizer, aux_weight: float):
    @jax.jit
    def train_step(params, opt_state, batch):
        (_, metrics), grads = jax.value_and_grad(loss_and_metrics, has_aux=True)(params, graphdef, batch,
                                                                                   aux_weight)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return train_step


# ---------------------------------------------------------------------------------------------------------------
# Export


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, prefix + (k,))
    else:
        yield prefix, tree


def export(params, folder: pathlib.Path) -> pathlib.Path:
    """Write the trained parameters as a Hugging Face Gemma 3 checkpoint folder."""
    cfg = gemma3.parse_config(CONFIG)
    tensors = checkpoint_tensors({p: np.asarray(v) for p, v in _flatten(params["model"])}, gemma3.weight_map(cfg),
                                 gemma3_weight_shapes(CONFIG))
    write_folder_files(folder)
    save_weights(folder, tensors)
    (folder / "model.safetensors").chmod(0o644)
    return folder


# ---------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "app" / "checkpoints" / "shapes-gemma3"))
    p.add_argument("--vision-steps", type=int, default=8000, help="steps of the vision phase (before the rest)")
    p.add_argument("--vision-lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=4000, help="steps of conversations")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--curriculum", type=int, default=300, help="steps whose scenes have mostly one shape")
    p.add_argument("--aux-weight", type=float, default=1.0, help="weight of the image attribute loss")
    p.add_argument("--init", help="start from the weights of this checkpoint folder instead of random ones (a "
                                  "run continued; the attribute heads start again from zero)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--export-every", type=int, default=0, help="also write the folder every this many steps")
    args = p.parse_args(argv)

    out = pathlib.Path(args.out)
    cfg = gemma3.parse_config(CONFIG)
    with tempfile.TemporaryDirectory() as tmp:  # the processor reads the tokenizer and processor files
        processor = gemma3.make_processor(write_folder_files(pathlib.Path(tmp)), cfg)
    graphdef, params = initial_params(cfg, args.seed)
    if args.init:
        from omnijax.app.pipeline import Pipeline

        loaded = Pipeline.from_pretrained(args.init).engine.params
        params["model"] = jax.tree.map(lambda ours, theirs: jnp.asarray(theirs, ours.dtype), params["model"], loaded)
        print(f"[train] starting from {args.init}", flush=True)
    n_params = sum(np.asarray(v).size for _, v in _flatten(params["model"]))
    print(f"[train] {n_params / 1e6:.2f}M parameters, {args.steps} steps, seed {args.seed}", flush=True)
    start = time.perf_counter()
    if args.vision_steps:
        params = train_vision(params, graphdef, processor, args)
    optimizer = make_optimizer(args.steps, args.lr, args.warmup)
    opt_state = optimizer.init(params)
    train_step = make_train_step(graphdef, optimizer, args.aux_weight)
    batcher = Batcher(processor, args.seed, args.curriculum)
    sums: dict[str, list[float]] = {}
    for step, batch in enumerate(prefetch(batcher.batch, 0, args.steps)):
        kind = batch.pop("kind")
        params, opt_state, metrics = train_step(params, opt_state, batch)
        for name, value in metrics.items():
            sums.setdefault(f"{kind}_{name}", []).append(float(value))
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.perf_counter() - start
            summary = " ".join(f"{k} {np.mean(v):.4f}" for k, v in sorted(sums.items()))
            print(f"[train] step {step + 1}/{args.steps} {elapsed:.0f}s {summary}", flush=True)
            sums = {}
        if args.export_every and (step + 1) % args.export_every == 0 and step + 1 < args.steps:
            export(params, out)
    seconds = time.perf_counter() - start
    export(params, out)
    print(json.dumps({"vision_steps": args.vision_steps, "steps": args.steps, "seed": args.seed,
                      "seconds": round(seconds, 1), "parameters": int(n_params), "out": str(out)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
