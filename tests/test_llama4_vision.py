"""Parity of the Llama 4 image encoder (vision tower + adapter + projector) with transformers on the tiny checkpoint,
its collate / jit contract, weight map and config checks."""

from __future__ import annotations

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
from flax import nnx

from omnijax.common.errors import CheckpointError, MediaError
from omnijax.encoders.llama4.vision import (Llama4ImageEncoder, Llama4VisionConfig, llama4_image_encoder_weight_map,
                                            pixel_shuffle, vision_rope_angles)
from omnijax.preprocess.llama4.image_batch import collate
from fixtures.module_parity import flat_paths, load_module

pytestmark = pytest.mark.reference

VISION_PREFIXES = ("vision_model.", "multi_modal_projector.")


def assert_close(ours, ref, tol: float = 1e-5) -> float:
    """max |ours - ref| <= tol * max |ref| (relative to the output's own scale); returns that relative error."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    scale = float(np.abs(ref).max())
    assert scale > 0.1, f"reference output too small to compare ({scale})"
    err = float(np.abs(ours - ref).max()) / scale
    assert err <= tol, f"max abs diff {err * scale} vs output scale {scale}"
    return err


def _tensors(folder) -> dict[str, np.ndarray]:
    with safetensors.safe_open(str(folder / "model.safetensors"), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(VISION_PREFIXES)}


@pytest.fixture(scope="module")
def vision_cfg(tiny_llama4_dir) -> Llama4VisionConfig:
    return Llama4VisionConfig.from_model_config(json.loads((tiny_llama4_dir / "config.json").read_text()))


@pytest.fixture(scope="module")
def encoder(tiny_llama4_dir, vision_cfg):
    """(graphdef, params, jitted apply with a trace counter) of our encoder loaded from the tiny checkpoint."""
    graphdef, params = load_module(lambda: Llama4ImageEncoder(vision_cfg, rngs=nnx.Rngs(0)),
                                   llama4_image_encoder_weight_map(vision_cfg), _tensors(tiny_llama4_dir))
    traces = []

    def apply(p, inputs):
        traces.append(inputs["pixel_values"].shape)
        return nnx.merge(graphdef, p)(inputs)

    return params, jax.jit(apply), traces


def _run(encoder, items):
    params, apply, _ = encoder
    feats, valid = apply(params, collate(items))
    return np.asarray(feats), np.asarray(valid)


def _split_tiles(pixel_values, layouts):
    counts = [r * c + (r * c > 1) for r, c in layouts]
    return np.split(pixel_values, np.cumsum(counts)[:-1])


def test_features_match_reference(encoder, hf_llama4_model, llama4_reference, vision_cfg):
    """Three images of 1, 3 and 7 tiles in one batch (the reference processor's pixel values) -> the reference's
    projected image features."""
    pixels = llama4_reference["mixed_tiles/pixel_values"]
    layouts = [tuple(int(v) for v in r) for r in llama4_reference["mixed_tiles/aspect_ratios"]]
    assert layouts == [(1, 1), (2, 1), (3, 2)] and pixels.shape[0] == 11
    with torch.no_grad():
        hidden = hf_llama4_model.get_image_features(pixel_values=torch.from_numpy(pixels)).last_hidden_state
        ref = hf_llama4_model.multi_modal_projector(hidden.reshape(-1, hidden.shape[-1])).numpy()
    feats, valid = _run(encoder, _split_tiles(pixels, layouts))
    tokens = vision_cfg.tokens_per_tile
    assert feats.shape == (16 * tokens, 64) and valid.shape == (16 * tokens,)
    assert valid.tolist() == [True] * (11 * tokens) + [False] * (5 * tokens)
    rel = assert_close(feats[valid], ref)
    print(f"llama4 image features (11 tiles): rel err {rel:.2e}")


def test_features_fill_patch_placeholders_in_order(encoder, hf_llama4_model, llama4_reference, tiny_llama4_dir):
    """The j-th valid feature row is what the j-th <|patch|> of the prompt gets: our features placed at the
    <|patch|> positions in order equal the input embeddings transformers builds (masked_scatter) for the
    reference processor's input ids and pixel values."""
    ids = llama4_reference["mixed_tiles/input_ids"]
    pixels = llama4_reference["mixed_tiles/pixel_values"]
    layouts = [tuple(int(v) for v in r) for r in llama4_reference["mixed_tiles/aspect_ratios"]]
    captured = {}

    def grab(module, args, kwargs):
        captured["embeds"] = kwargs["inputs_embeds"].detach().numpy().copy()

    handle = hf_llama4_model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            hf_llama4_model(input_ids=torch.from_numpy(ids)[None], pixel_values=torch.from_numpy(pixels))
    finally:
        handle.remove()
    feats, valid = _run(encoder, _split_tiles(pixels, layouts))
    with safetensors.safe_open(str(tiny_llama4_dir / "model.safetensors"), "np") as f:
        table = f.get_tensor("language_model.model.embed_tokens.weight")
    ours = table[ids].copy()
    patch_id = hf_llama4_model.config.image_token_id
    assert (ids == patch_id).sum() == valid.sum()
    ours[ids == patch_id] = feats[valid]
    rel = assert_close(ours, captured["embeds"][0])
    print(f"llama4 input embeddings with image features: rel err {rel:.2e}")


def test_features_match_reference_with_tiny_embeddings(encoder, hf_llama4_model, tiny_llama4_dir, vision_cfg,
                                                      llama4_reference):
    """Patch, class and position embeddings scaled by 1e-3: the first LayerNorm's input variance (~1e-7) is then
    far below its eps, so the eps (1e-5, the reference's nn.LayerNorm default) decides the output."""
    tower = copy.deepcopy(hf_llama4_model.vision_model)
    scaled = ("patch_embedding.linear.weight", "class_embedding", "positional_embedding_vlm")
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if name in scaled:
                p.mul_(1e-3)
    tensors = _tensors(tiny_llama4_dir)
    for name in scaled:
        tensors[f"vision_model.{name}"] = tensors[f"vision_model.{name}"] * np.float32(1e-3)
    _, params = load_module(lambda: Llama4ImageEncoder(vision_cfg, rngs=nnx.Rngs(0)),
                            llama4_image_encoder_weight_map(vision_cfg), tensors)
    pixels = llama4_reference["mixed_tiles/pixel_values"]
    with torch.no_grad():
        hidden = tower(torch.from_numpy(pixels)).last_hidden_state
        ref = hf_llama4_model.multi_modal_projector(hidden.reshape(-1, hidden.shape[-1])).numpy()
    _, apply, _ = encoder  # the same program as the other tests (same shapes), other parameter values
    feats, valid = apply(params, collate([pixels]))
    assert_close(np.asarray(feats)[np.asarray(valid)], ref)


def test_new_tile_count_inside_bucket_does_not_recompile(encoder, llama4_reference):
    params, apply, traces = encoder
    tiles = llama4_reference["mixed_tiles/pixel_values"]
    before = len(traces)
    for n in (3, 4):  # one bucket of 4 tiles: one program
        feats, valid = apply(params, collate([tiles[:n]]))
        assert int(np.asarray(valid).sum()) == n * 9
    assert [shape[0] for shape in traces[before:]] == [4]


def test_collate_concatenates_and_pads():
    a = np.full((1, 3, 4, 4), 1.0, np.float32)
    b = np.full((3, 3, 4, 4), 2.0, np.float32)
    c = np.full((7, 3, 4, 4), 3.0, np.float32)
    out = collate([a, b, c])
    assert out["pixel_values"].shape == (16, 3, 4, 4) and int(out["num_tiles"]) == 11
    np.testing.assert_array_equal(out["pixel_values"][:, 0, 0, 0], [1] + [2] * 3 + [3] * 7 + [0] * 5)
    assert collate([a])["pixel_values"].shape[0] == 1
    assert collate([b])["pixel_values"].shape[0] == 4
    with pytest.raises(MediaError, match="no images"):
        collate([])
    with pytest.raises(MediaError, match="one tile size"):
        collate([a, np.zeros((1, 3, 8, 8), np.float32)])
    with pytest.raises(MediaError, match="over the limit"):
        collate([c, c], max_tiles=10)


def test_pixel_shuffle_blocks():
    # A 4 x 4 grid of 2-feature tokens -> 2 x 2 tokens; token (p, q) holds the 2 x 2 block at rows 2p, 2p+1 and
    # columns 2q, 2q+1 as [x(2p, 2q), x(2p, 2q+1), x(2p+1, 2q), x(2p+1, 2q+1)].
    x = np.arange(16 * 2, dtype=np.float32).reshape(1, 16, 2)
    grid = x.reshape(4, 4, 2)
    out = np.asarray(pixel_shuffle(jnp.asarray(x), 0.5))
    assert out.shape == (1, 4, 8)
    for p in range(2):
        for q in range(2):
            block = [grid[2 * p, 2 * q], grid[2 * p, 2 * q + 1], grid[2 * p + 1, 2 * q], grid[2 * p + 1, 2 * q + 1]]
            np.testing.assert_array_equal(out[0, 2 * p + q], np.concatenate(block))


def test_rope_angles_hand_case():
    # head_dim 8 -> frequencies 1 and theta**-0.5 = 0.1; pairs 0, 1 turn with (column + 1), pairs 2, 3 with
    # (row + 1); the class token (last) does not turn.
    cfg = Llama4VisionConfig(hidden_size=32, intermediate_size=128, num_attention_heads=4, image_size=4, patch_size=2,
                             projector_input_dim=8, projector_output_dim=8, vision_output_dim=8, rope_theta=100.0,
                             text_hidden_size=8, num_hidden_layers=1)
    expected = np.array([[1, 0.1, 1, 0.1], [2, 0.2, 1, 0.1], [1, 0.1, 2, 0.2], [2, 0.2, 2, 0.2], [0, 0, 0, 0]])
    np.testing.assert_allclose(vision_rope_angles(cfg), expected, rtol=1e-6)


def test_weight_map_covers_checkpoint(tiny_llama4_dir, vision_cfg):
    with safetensors.safe_open(str(tiny_llama4_dir / "model.safetensors"), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    disk = {k for k in shapes if k.startswith(VISION_PREFIXES)}
    wmap = llama4_image_encoder_weight_map(vision_cfg)
    assert {spec.key for spec in wmap.values()} == disk
    module = nnx.eval_shape(lambda: Llama4ImageEncoder(vision_cfg, rngs=nnx.Rngs(0)))
    abstract = flat_paths(nnx.to_pure_dict(nnx.split(module)[1]))
    assert set(abstract) == set(wmap)
    for path, spec in wmap.items():
        assert spec.apply(np.zeros(shapes[spec.key], np.float32)).shape == tuple(abstract[path].shape), path


def test_params_carry_logical_axes(vision_cfg):
    module = nnx.eval_shape(lambda: Llama4ImageEncoder(vision_cfg, rngs=nnx.Rngs(0)))
    for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        axes = var.get_metadata().get("axes")
        assert axes is not None and len(axes) == len(var.shape), (path, axes, var.shape)


def test_config_published_sizes():
    # Llama 4 Scout / Maverick's vision config: 336-pixel tiles of 14-pixel patches -> 144 tokens per tile.
    cfg = Llama4VisionConfig.from_hf({
        "hidden_size": 1408, "image_size": 336, "intermediate_size": 5632, "num_attention_heads": 16,
        "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5, "projector_input_dim": 4096,
        "projector_output_dim": 4096, "vision_output_dim": 4096, "rope_theta": 10000}, text_hidden_size=5120)
    assert (cfg.tokens_per_tile, cfg.num_patches, cfg.head_dim, cfg.shuffled_dim) == (144, 576, 88, 5632)


@pytest.mark.parametrize("change,message", [
    ({"intermediate_size": 100}, "intermediate_size"),
    ({"projector_input_dim": 40}, "projector_input_dim"),
    ({"vision_output_dim": 40}, "vision_output_dim"),
    ({"num_attention_heads": 16}, "divisible by 4"),
    ({"patch_size": 5}, "multiple of patch_size"),
    ({"num_hidden_layers": 100000}, "num_hidden_layers"),
    ({"hidden_size": "wide"}, "hidden_size"),
    ({"pixel_shuffle_ratio": 0.0}, "pixel_shuffle_ratio"),
])
def test_config_errors(change, message):
    import fixtures.llama4_checkpoint as lc

    vision = {**lc.TINY_LLAMA4_VISION_CONFIG, **change}
    with pytest.raises(CheckpointError, match=message):
        Llama4VisionConfig.from_hf(vision, text_hidden_size=64)
