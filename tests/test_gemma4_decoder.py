"""Gemma 4's decoder pieces on their own, against transformers' modules with every weight random: the router, the
experts beside the MLP (through the weight-map layout changes), the per-layer inputs; and the config readers (layer
types, KV sharing, per-layer overrides in both saved layouts), the weight map and the keys it skips."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Gemma4TextConfig
from transformers.models.gemma4 import modeling_gemma4 as hf

import fixtures.gemma4_checkpoint as g4
from omnijax.app.families.gemma4.spec import (decoder_config, expert_gate_up, kv_sources, layer_overrides, layer_types,
                                 parse_config, unused_keys, weight_map)
from omnijax.common.weights import TensorSpec, linear, plain
from omnijax.decoder.gemma4.layer_inputs import Gemma4LayerInputs, table_ids
from omnijax.decoder.gemma4.moe import ExpertsBeside, Gemma4Router
from omnijax.decoder.spec import FeedForwardSpec
from fixtures.module_parity import assert_close, load_module

pytestmark = pytest.mark.reference

HIDDEN, EXPERTS, TOP_K, WIDTH = 32, 6, 2, 12
TEXT = dict(vocab_size=50, hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, global_head_dim=16, enable_moe_block=True, num_experts=EXPERTS,
            top_k_experts=TOP_K, moe_intermediate_size=WIDTH, hidden_size_per_layer_input=4,
            vocab_size_per_layer_input=50, rms_norm_eps=1e-5, pad_token_id=0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"])
MOE = FeedForwardSpec("moe", WIDTH, "gelu_pytorch_tanh", num_experts=EXPERTS, top_k=TOP_K, router="gemma4")


def _randomise(module: torch.nn.Module, seed: int) -> dict[str, np.ndarray]:
    g4.randomise_(module, seed)
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def _tokens(seed: int, n: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, HIDDEN)).astype(np.float32) * 3


def test_router_matches_transformers():
    router = hf.Gemma4TextRouter(Gemma4TextConfig(**TEXT)).eval()
    tensors = _randomise(router, 1)
    wm = {("weight",): linear("proj"), ("scale",): plain("scale"), ("per_expert_scale",): plain("per_expert_scale")}
    graphdef, params = load_module(lambda: Gemma4Router(MOE, HIDDEN, eps=1e-5, rngs=nnx.Rngs(0)), wm, tensors)
    x = _tokens(2)
    weights, ids = nnx.merge(graphdef, params)(x)
    with torch.no_grad():
        _, ref_w, ref_i = router(torch.from_numpy(x))
    np.testing.assert_array_equal(np.asarray(ids), ref_i.numpy())
    assert_close(weights, ref_w.numpy())


def test_experts_beside_match_transformers():
    config = Gemma4TextConfig(**TEXT)
    router, experts = hf.Gemma4TextRouter(config).eval(), hf.Gemma4TextExperts(config).eval()
    experts.config._experts_implementation = "eager"
    tensors = {f"router.{k}": v for k, v in _randomise(router, 3).items()}
    tensors.update({f"experts.{k}": v for k, v in _randomise(experts, 4).items()})
    wm = {("router", "weight"): linear("router.proj"), ("router", "scale"): plain("router.scale"),
          ("router", "per_expert_scale"): plain("router.per_expert_scale"),
          ("gate_proj",): TensorSpec("experts.gate_up_proj", fn=expert_gate_up(0)),
          ("up_proj",): TensorSpec("experts.gate_up_proj", fn=expert_gate_up(1)),
          ("down_proj",): TensorSpec("experts.down_proj", transpose=(0, 2, 1))}
    graphdef, params = load_module(lambda: ExpertsBeside(MOE, HIDDEN, Gemma4Router, eps=1e-5, rngs=nnx.Rngs(0)), wm,
                                   tensors)
    # many tokens (the tiled path) and few (the gathered path); the router reads another input than the experts
    for n in (70, 5):
        x, route = _tokens(5, n), _tokens(6, n)
        ours = nnx.merge(graphdef, params)(x[None], route[None])[0]
        with torch.no_grad():
            _, w, i = router(torch.from_numpy(route))
            ref = experts(torch.from_numpy(x), i, w).numpy()
        assert_close(ours, ref)


def test_expert_layout_changes():
    a = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)  # [experts, 2 I, D]
    np.testing.assert_array_equal(expert_gate_up(0)(a), a[:, :3].transpose(0, 2, 1))
    np.testing.assert_array_equal(expert_gate_up(1)(a), a[:, 3:].transpose(0, 2, 1))


def test_per_layer_inputs_match_transformers():
    config = Gemma4TextConfig(**dict(TEXT, enable_moe_block=False))
    model = hf.Gemma4TextModel(config).eval()
    tensors = _randomise(model, 7)
    spec = decoder_config(dict(TEXT, enable_moe_block=False), placeholder_ids=(47, 48))
    wm = {("embedding",): plain("embed_tokens_per_layer.weight"),
          ("projection", "kernel"): linear("per_layer_model_projection"),
          ("norm", "weight"): plain("per_layer_projection_norm.weight")}
    graphdef, params = load_module(lambda: Gemma4LayerInputs(spec, rngs=nnx.Rngs(0)), wm, tensors)
    tokens = np.array([[2, 47, 47, 9, 48, 31, 0]])
    embeddings = np.random.default_rng(8).normal(size=(1, 7, HIDDEN)).astype(np.float32)
    ours = nnx.merge(graphdef, params)(tokens, embeddings)
    replaced = torch.from_numpy(np.where(np.isin(tokens, (47, 48)), 0, tokens))  # what Gemma4Model passes
    with torch.no_grad():
        ref = model.project_per_layer_inputs(torch.from_numpy(embeddings), model.get_per_layer_inputs(replaced))
    assert_close(ours, ref.numpy())


def test_table_ids():
    tokens = np.array([[5, 47, -1, 60, 48, 0]])
    np.testing.assert_array_equal(np.asarray(table_ids(tokens, (47, 48), 3, 50)), [[5, 3, 3, 3, 3, 0]])


def test_layer_types_and_kv_sources():
    assert layer_types({}, 7) == ("sliding",) * 5 + ("full", "full")  # the default pattern, last layer full
    assert layer_types({"layer_types": ["sliding_attention"] * 3}, 3) == ("sliding", "sliding", "full")
    kinds = ("sliding", "sliding", "full", "sliding", "full", "sliding", "full")
    assert kv_sources(kinds, 0) == (None,) * 7
    assert kv_sources(kinds, 3) == (None, None, None, None, 2, 3, 2)
    with pytest.raises(ValueError, match="no earlier layer"):
        kv_sources(("sliding", "full", "full"), 2)
    # the same as transformers' kv_sharing_modes
    config = Gemma4TextConfig(**dict(TEXT, num_hidden_layers=7, num_kv_shared_layers=3,
                                     layer_types=[f"{k}_attention" for k in kinds]))
    assert [m == "reuse" for m in config.kv_sharing_modes] == [s is not None for s in kv_sources(kinds, 3)]


@pytest.mark.parametrize("text", [g4.TINY_GEMMA4_SMALL_TEXT_CONFIG, g4.TINY_GEMMA4_MOE_TEXT_CONFIG])
def test_saved_per_layer_config_reads_like_the_published_layout(text):
    """transformers 5 saves the full layers' own head_dim / kv heads as ``per_layer_config``; the published files
    hold ``global_head_dim`` / ``num_global_key_value_heads``: both give the same decoder, with transformers' own
    per-layer values."""
    config = Gemma4TextConfig(**copy.deepcopy(text))
    saved = config.to_dict()
    assert "per_layer_config" in saved and "global_head_dim" not in saved
    published = g4.published_text_config(saved, text)
    spec = decoder_config(saved)
    assert spec == decoder_config(published)
    for i, layer in enumerate(spec.layers):
        assert layer.attention.head_dim == config.per_layer_config[i].head_dim
        assert layer.attention.num_kv_heads == config.per_layer_config[i].num_key_value_heads
    get = lambda k: published.get(k)  # noqa: E731
    with pytest.raises(ValueError, match="may only set"):
        layer_overrides({"per_layer_config": {"2": {"sliding_window": 4}}}, ("full",) * 3, get)


def test_weight_map_reads_every_tensor_and_skips_what_exports_add(tiny_gemma4_small_dir, tiny_gemma4_moe_dir,
                                                                  tiny_gemma4_text_dir):
    """Every tensor of the three folders is read; the KV-sharing layers' k/v projections and norms (which the
    published checkpoints keep) and a tied head's copy are skipped, and nothing else is."""
    from omnijax.app.checkpoint import TensorIndex, abstract_params, check_weight_map
    from omnijax.app.families.gemma4.spec import SPEC
    from omnijax.app.model import abstract_model
    from omnijax.common.errors import CheckpointError

    for folder in (tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir):
        hf_config = json.loads((folder / "config.json").read_text())
        cfg = parse_config(hf_config)
        _, shapes = abstract_params(abstract_model(cfg, SPEC))
        keys = TensorIndex(folder, SPEC.key_aliases).keys()
        wm, unused = weight_map(cfg), unused_keys(cfg, hf_config)
        assert set(wm) == set(shapes)
        assert check_weight_map(shapes, wm, keys, unused) == []
        assert check_weight_map(shapes, wm, keys | {"lm_head.weight"}, unused) == ["lm_head.weight"]
        with pytest.raises(CheckpointError, match="unexpected"):
            check_weight_map(shapes, wm, keys | {"model.layers.0.self_attn.k_proj.bias"}, unused)
        if folder != tiny_gemma4_moe_dir:  # the last three layers share keys / values
            extra = {f"model.layers.{i}.self_attn.{n}.weight" for i in (3, 4, 5)
                     for n in ("k_proj", "v_proj", "k_norm")}
            assert set(check_weight_map(shapes, wm, keys | extra, unused)) == extra
            assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in (3, 4, 5)} <= keys
