"""Parity of the SigLIP vision tower, the Gemma 3 projector and Gemma 3's image encoder (both, on a bucketed image
batch through ``collate`` + jitted ``__call__``) against Hugging Face on tiny random configs."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
from flax import nnx
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionModel
from transformers import SiglipVisionConfig as HFSiglipVisionConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

from omnijax.common.errors import MediaError
from omnijax.common.weights import prefixed
from omnijax.encoders.gemma3.image_encoder import Gemma3ImageEncoder
from omnijax.encoders.gemma3.projector import Gemma3Projector, gemma3_projector_weight_map
from omnijax.encoders.gemma3.siglip import (SiglipVisionConfig, SiglipVisionTower, siglip_unused_key_pattern,
                                            siglip_unused_keys, siglip_weight_map)
from omnijax.preprocess.gemma3.image_batch import collate

from fixtures.module_parity import assert_close, flat_paths, load_module

pytestmark = pytest.mark.reference


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter: norms (1-D weights named *norm*) ~ N(0, 0.5), everything else ~ N(0, 0.2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            std = 0.5 if "norm" in name else 0.2
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def _state_dict_np(module: torch.nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in module.state_dict().items():
        if k.startswith("vision_model."):  # older transformers nest the tower under vision_model
            k = k[len("vision_model."):]
        out[prefix + k] = v.detach().float().numpy()
    return out


def _run(graphdef, params, x):
    return np.asarray(jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, x))


def _tiny_siglip(image_size, patch_size, layers, **kw) -> dict:
    return dict(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                num_channels=3, image_size=image_size, patch_size=patch_size, layer_norm_eps=1e-6,
                hidden_act="gelu_pytorch_tanh") | kw


@pytest.mark.parametrize("image_size,patch_size,layers,attn", [
    (32, 8, 1, "sdpa"),
    (32, 8, 1, "eager"),
    (64, 8, 2, "sdpa"),
])
def test_siglip_tower_matches_hf(image_size, patch_size, layers, attn):
    hf_dict = _tiny_siglip(image_size, patch_size, layers)
    hf_cfg = HFSiglipVisionConfig(**hf_dict)
    hf_cfg._attn_implementation = attn
    torch.manual_seed(0)
    ref_model = SiglipVisionModel(hf_cfg).eval()
    _randomise(ref_model, seed=image_size + layers)

    cfg = SiglipVisionConfig.from_hf(hf_dict)
    assert cfg.num_patches == (image_size // patch_size) ** 2
    prefix = "vision_tower."
    graphdef, params = load_module(lambda: SiglipVisionTower(cfg, rngs=nnx.Rngs(0)), siglip_weight_map(cfg, prefix),
                             _state_dict_np(ref_model, prefix))

    pixels = np.random.default_rng(1).uniform(-1, 1, (2, 3, image_size, image_size)).astype(np.float32)
    with torch.no_grad():
        ref = ref_model(pixel_values=torch.from_numpy(pixels)).last_hidden_state.numpy()
    ours = _run(graphdef, params, jnp.asarray(pixels))
    rel = assert_close(ours, ref)
    print(f"siglip {image_size}/{patch_size} x{layers} {attn}: rel err {rel:.2e}")


@pytest.mark.parametrize("image_size,patch_size,mm_tokens", [(64, 8, 16), (32, 8, 4)])
def test_gemma3_projector_matches_hf(image_size, patch_size, mm_tokens):
    vision = _tiny_siglip(image_size, patch_size, 1, layer_norm_eps=1e-5)
    config = Gemma3Config(vision_config=vision, text_config=dict(hidden_size=24), mm_tokens_per_image=mm_tokens)
    torch.manual_seed(0)
    ref_model = Gemma3MultiModalProjector(config).eval()
    _randomise(ref_model, seed=mm_tokens)

    pps, tps = image_size // patch_size, int(round(mm_tokens ** 0.5))
    prefix = "multi_modal_projector."
    graphdef, params = load_module(
        lambda: Gemma3Projector(32, 24, pps, tps, eps=config.vision_config.layer_norm_eps, rngs=nnx.Rngs(0)),
        gemma3_projector_weight_map(prefix), _state_dict_np(ref_model, prefix))

    # Distinct per-patch offsets make any mix-up of the pooling order show.
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(2, pps * pps, 32)) + np.arange(pps * pps)[None, :, None] * 0.3).astype(np.float32)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(x)).numpy()
    ours = _run(graphdef, params, jnp.asarray(x))
    assert ours.shape == (2, mm_tokens, 24)
    rel = assert_close(ours, ref)
    print(f"projector {pps}x{pps}->{tps}x{tps}: rel err {rel:.2e}")


def test_gemma3_image_encoder_matches_hf():
    """Images through collate + the jitted encoder equal transformers' tower + projector on the valid rows; 3 and 4
    images share the 4-image program; a wrong-sized image is refused on the host."""
    vision = _tiny_siglip(32, 8, 2)
    config = Gemma3Config(vision_config=vision, text_config=dict(hidden_size=24), mm_tokens_per_image=4)
    hf_tower_cfg = HFSiglipVisionConfig(**vision)
    hf_tower_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref_tower, ref_proj = SiglipVisionModel(hf_tower_cfg).eval(), Gemma3MultiModalProjector(config).eval()
    _randomise(ref_tower, seed=5)
    _randomise(ref_proj, seed=6)
    cfg = SiglipVisionConfig.from_hf(vision)
    graphdef, params = load_module(
        lambda: Gemma3ImageEncoder(cfg, 4, 24, rngs=nnx.Rngs(0)),
        {**prefixed(siglip_weight_map(cfg, "vision_tower."), ("tower",)),
         **prefixed(gemma3_projector_weight_map("multi_modal_projector."), ("projector",))},
        {**_state_dict_np(ref_tower, "vision_tower."), **_state_dict_np(ref_proj, "multi_modal_projector.")})
    pixel_shape = (cfg.num_channels, cfg.image_size, cfg.image_size)
    jitted = jax.jit(lambda p, inputs: nnx.merge(graphdef, p)(inputs))
    rng = np.random.default_rng(3)
    compiled = None
    for n in (3, 4):
        pixels = rng.uniform(-1, 1, (n, 3, 32, 32)).astype(np.float32)
        inputs = collate(list(pixels), pixel_shape)
        assert inputs["pixels"].shape == (4, 3, 32, 32)
        assert inputs["image_valid"].tolist() == [True] * n + [False] * (4 - n)
        features, valid, extras = jax.tree.map(np.asarray, jitted(params, inputs))
        if compiled is None:
            compiled = jitted._cache_size()
        with torch.no_grad():
            ref = ref_proj(ref_tower(pixel_values=torch.from_numpy(pixels)).last_hidden_state).numpy()
        assert features.shape == (16, 24) and valid.tolist() == [True] * (4 * n) + [False] * (16 - 4 * n)
        assert extras == ()
        rel = assert_close(features[valid], ref.reshape(-1, 24))
        print(f"gemma3 image encoder, {n} images: rel err {rel:.2e}")
    assert jitted._cache_size() == compiled == 1
    with pytest.raises(MediaError, match=r"image 1: expected pixel values of shape \(3, 32, 32\), got \(3, 64, 64\)"):
        collate([np.zeros((3, 32, 32), np.float32), np.zeros((3, 64, 64), np.float32)], pixel_shape)
    assert jitted._cache_size() == 1


def test_from_hf_defaults():
    cfg = SiglipVisionConfig.from_hf({})
    hf = HFSiglipVisionConfig()
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_channels, cfg.image_size, cfg.patch_size, cfg.layer_norm_eps, cfg.hidden_act) == (
        hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_channels,
        hf.image_size, hf.patch_size, hf.layer_norm_eps, hf.hidden_act)
    gemma3_4b = SiglipVisionConfig.from_hf({"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                            "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14})
    assert gemma3_4b.num_patches == 4096 and gemma3_4b.head_dim == 72


def test_weight_map_paths_match_module_state():
    cfg = SiglipVisionConfig.from_hf(_tiny_siglip(32, 8, 3))
    _, state = nnx.split(nnx.eval_shape(lambda: SiglipVisionTower(cfg, rngs=nnx.Rngs(0))))
    assert set(flat_paths(nnx.to_pure_dict(state))) == set(siglip_weight_map(cfg))
    _, state = nnx.split(nnx.eval_shape(lambda: Gemma3Projector(32, 24, 8, 4, rngs=nnx.Rngs(0))))
    assert set(flat_paths(nnx.to_pure_dict(state))) == set(gemma3_projector_weight_map())


def _every_param_has_axes(module) -> None:
    for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        axes = var.get_metadata().get("axes")
        assert axes is not None and len(axes) == var.shape.__len__(), (path, axes, var.shape)


def test_params_carry_logical_axes():
    cfg = SiglipVisionConfig.from_hf(_tiny_siglip(32, 8, 1))
    _every_param_has_axes(nnx.eval_shape(lambda: SiglipVisionTower(cfg, rngs=nnx.Rngs(0))))
    _every_param_has_axes(nnx.eval_shape(lambda: Gemma3Projector(32, 24, 4, 2, rngs=nnx.Rngs(0))))


@pytest.mark.parametrize("use_head", [True, False])
def test_keys_match_saved_gemma3_checkpoint(tmp_path, use_head):
    vision = _tiny_siglip(32, 8, 2, vision_use_head=use_head)
    config = Gemma3Config(
        vision_config=vision,
        text_config=dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=12, vocab_size=512),
        mm_tokens_per_image=4, image_token_index=500, boi_token_index=501, eoi_token_index=502)
    Gemma3ForConditionalGeneration(config).save_pretrained(tmp_path)
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    disk = {k for k in shapes if k.startswith(("vision_tower.", "multi_modal_projector."))}

    hf_config = json.loads((tmp_path / "config.json").read_text())
    cfg = SiglipVisionConfig.from_hf(hf_config["vision_config"])
    tower_map = siglip_weight_map(cfg)
    proj_map = gemma3_projector_weight_map()
    mapped = {spec.key for spec in (*tower_map.values(), *proj_map.values())}
    unused = set(siglip_unused_keys(cfg, hf_config))
    assert mapped | unused == disk, (disk - mapped - unused, (mapped | unused) - disk)
    assert not mapped & unused
    assert bool(unused) == use_head
    pattern = siglip_unused_key_pattern()
    assert {k for k in disk if pattern.fullmatch(k)} == unused

    # Shapes after the layout change equal the module's parameter shapes.
    for module, wmap in ((SiglipVisionTower(cfg, rngs=nnx.Rngs(0)), tower_map),
                         (Gemma3Projector(32, 24, 4, 2, rngs=nnx.Rngs(0)), proj_map)):
        abstract = flat_paths(nnx.to_pure_dict(nnx.split(module)[1]))
        for path, spec in wmap.items():
            got = spec.apply(np.zeros(shapes[spec.key], np.float32)).shape
            assert got == tuple(abstract[path].shape), (path, got)
