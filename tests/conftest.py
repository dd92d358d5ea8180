"""Shared session fixtures: tiny Gemma 3 checkpoint folders written by Hugging Face ``save_pretrained``.

Every folder holds the same random weights (drawn with a fixed torch seed, nothing left at its zero / one
initialisation), the tokenizer, chat template and processor files of :mod:`fixtures.tiny_gemma3`, and the
instruction-tuned generation config (eos = ``[<eos>, <end_of_turn>]``). Also the pipelines on them, and the
other families' tiny folders and references, and two small media files of the web demo's tests.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

# The suite runs on CPU (parity with transformers on CPU float32), also on machines with an accelerator.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every process the tests start (command-line runs, servers, four-device runs, scripts) runs without torch, as on a
# user's machine: tests/fixtures/without_torch/sitecustomize.py hides it there (about 3 s of every start, which
# transformers spends importing it). This process computes the references with it: it takes it back.
if "torch" in sys.modules and sys.modules["torch"] is None:
    del sys.modules["torch"]
from fixtures.child_path import WITHOUT_TORCH  # noqa: E402

if str(WITHOUT_TORCH) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(WITHOUT_TORCH), os.environ.get("PYTHONPATH")) if p)
# XLA's CPU programs are compiled without LLVM's optimizations and with XLA's older loop-fusion emitters (here and in
# every process the tests start, which inherit XLA_FLAGS and add to it): the tiny models compile far longer than they
# run (a module of parity tests: 60 s -> 43 s without LLVM's optimizations -> 34 s with the older emitters as well;
# over the whole suite XLA's compile time fell from 784 to 476 s). What a program computes is the same; only the
# order of float32 sums may differ, which every comparison allows for (the benchmarks, not the tests, measure speed).
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
# The suite neither reads nor writes the user's persistent compilation cache (a stale or foreign entry must not
# decide a test); tests/test_compilation_cache.py turns it on in its own processes. It keeps a cache of its own
# instead, new for each run and shared by every process of the run (the xdist workers and the programs they start:
# command-line runs, servers, four-device runs), so a program is compiled once and loaded after
# (tests/test_compilation_cache.py shows that a loaded program computes what a fresh compile does). Set here, before
# JAX is imported; the folder is made by the first process (the one that starts the workers) and removed when it
# ends. No size bound: with one, JAX reads every entry's access time at each write (a run writes thousands). Without
# one JAX writes an entry in place, so the pytest processes write theirs whole (``_write_whole``); an entry read while
# a child writes it fails to decompress, which JAX reports as a warning and answers by compiling. A child the tests
# kill while it may be compiling gets a folder of its own (tests/test_caption.py).
os.environ["OMNIJAX_COMPILATION_CACHE"] = "0"
_RUN_CACHE = "OMNIJAX_TEST_RUN_CACHE"
if _RUN_CACHE not in os.environ:
    import atexit
    import tempfile

    os.environ[_RUN_CACHE] = tempfile.mkdtemp(prefix="omnijax-test-jax-cache-")
    atexit.register(shutil.rmtree, os.environ[_RUN_CACHE], ignore_errors=True)
os.environ.update(JAX_COMPILATION_CACHE_DIR=os.environ[_RUN_CACHE], JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
# Likewise the converted-weights cache (app/weight_cache.py): one of the run's own, shared by its processes (a second
# load of a checkpoint in the run reads it), removed at the end; the user's is left alone.
_RUN_WEIGHTS = "OMNIJAX_TEST_RUN_WEIGHT_CACHE"
if _RUN_WEIGHTS not in os.environ:
    import atexit
    import tempfile

    os.environ[_RUN_WEIGHTS] = tempfile.mkdtemp(prefix="omnijax-test-weight-cache-")
    atexit.register(shutil.rmtree, os.environ[_RUN_WEIGHTS], ignore_errors=True)
os.environ["OMNIJAX_WEIGHT_CACHE_DIR"] = os.environ[_RUN_WEIGHTS]


def _write_whole() -> None:
    """Make this process's unbounded JAX cache write each entry under a temporary name and rename it into place, so
    that another process never reads half of it."""
    from jax._src import lru_cache

    unbounded_put = lru_cache.LRUCache.put

    def put(self, key: str, value: bytes) -> None:
        if self.eviction_enabled:
            return unbounded_put(self, key, value)
        path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"
        if path.exists():
            return
        part = self.path / f".{key}.{os.getpid()}.part"
        part.write_bytes(value)
        os.replace(part, path)

    lru_cache.LRUCache.put = put


_write_whole()

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # plain `pytest` (not `python -m pytest`) does not put the repository root on the path
    sys.path.insert(0, _ROOT)

from fixtures import tiny_gemma3 as dm  # noqa: E402
from fixtures.step_shapes import few_step_shapes  # noqa: E402

TORCH_SEED = 1234


def _mappings() -> int:
    """How many memory mappings this process holds (0 where /proc is not there)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _mapping_limit() -> int:
    try:
        return int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs_near_the_mapping_limit():
    """After a test module, drop every compiled program once this process holds three quarters of the mappings the
    kernel allows (vm.max_map_count, 65530 by default): each program holds memory mappings of its machine code, and
    one process running the whole suite would otherwise reach the limit, where compiling crashes (one module adds at
    most about 8,000). Below it, the session's pipelines keep their programs from module to module."""
    yield
    if _mappings() > _mapping_limit() * 3 // 4:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()


_IMPLIES_SLOW = ("multidevice", "browser", "real")


def pytest_collection_modifyitems(config, items):
    """Tests marked multidevice, browser or real are slow too; and modules holding slow tests run first (in file
    order among themselves), so that with several workers (scripts/test.sh) the longest work starts early."""
    for item in items:
        if any(item.get_closest_marker(name) for name in _IMPLIES_SLOW) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    slow_modules = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module not in slow_modules)  # stable: file order within each group


def _randomise_(model, seed: int = TORCH_SEED) -> None:
    """Overwrite every parameter of ``model`` in place, with the per-name distributions of ``dm.init_std``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            mean, std = dm.init_std(name)
            param.copy_(mean + std * torch.randn(param.shape, generator=gen, dtype=torch.float32))


def make_hf_gemma3(config_dict: dict | None = None, seed: int = TORCH_SEED):
    """A randomised float32 ``Gemma3ForConditionalGeneration`` for ``config_dict`` (default: the tiny config)."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    config = Gemma3Config(**(config_dict if config_dict is not None else dm.TINY_GEMMA3_CONFIG))
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    _randomise_(model, seed)
    return model


def _save_hf_folder(folder, *, max_shard_size=None, **processor_kwargs):
    model = make_hf_gemma3()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    dm.write_generation_config(folder)
    dm.write_tokenizer_and_processor(
        folder,
        image_size=dm.TINY_GEMMA3_CONFIG["vision_config"]["image_size"],
        mm_tokens_per_image=dm.TINY_GEMMA3_CONFIG["mm_tokens_per_image"],
        **processor_kwargs,
    )
    return folder


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory):
    """A tiny Gemma 3 folder saved by HF ``save_pretrained`` (one ``model.safetensors``, float32)."""
    return _save_hf_folder(tmp_path_factory.mktemp("tiny_gemma3"))


@pytest.fixture(scope="session")
def tiny_gemma3_sharded_dir(tmp_path_factory):
    """The same weights as ``tiny_gemma3_dir``, saved in several shards with ``model.safetensors.index.json``."""
    return _save_hf_folder(tmp_path_factory.mktemp("tiny_gemma3_sharded"), max_shard_size="200KB")


@pytest.fixture(scope="session")
def tiny_gemma3_pas_dir(tmp_path_factory, tiny_gemma3_dir):
    """``tiny_gemma3_dir`` with a processor configured for pan-and-scan (min crop 32 px for 64 px images).

    transformers' ``Gemma3Processor`` only pans and scans when called with ``do_pan_and_scan=True`` and
    ``pan_and_scan_min_crop_size=32``: its call defaults override the image processor's configuration.
    """
    folder = tmp_path_factory.mktemp("tiny_gemma3_pas") / "model"
    shutil.copytree(tiny_gemma3_dir, folder)
    dm.write_tokenizer_and_processor(
        folder,
        image_size=dm.TINY_GEMMA3_CONFIG["vision_config"]["image_size"],
        mm_tokens_per_image=dm.TINY_GEMMA3_CONFIG["mm_tokens_per_image"],
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=32,
    )
    return folder


@pytest.fixture(scope="session")
def make_hf_gemma3_fn():
    """``make_hf_gemma3``: build a randomised HF model for any Gemma 3 config dict."""
    return make_hf_gemma3


@pytest.fixture(scope="session")
def hf_gemma3_model(tiny_gemma3_dir):
    """The torch reference model loaded from ``tiny_gemma3_dir``: float32, eager attention, eval mode."""
    import torch
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(
        tiny_gemma3_dir, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture(scope="session")
def gemma3_server(tmp_path_factory, tiny_gemma3_dir):
    """``omnijax serve`` on ``tiny_gemma3_dir`` (4 slots, a 1024-token context: a prompt declaring tools fits), one
    process for the session's API feature tests (log probabilities, structured outputs, tool calls): its base URL.
    Its tests compare counters before and after their own requests only."""
    from test_server import start_server

    url, proc = start_server(tiny_gemma3_dir, tmp_path_factory.mktemp("serve_features"),
                             ["--max-batch", "4", "--max-context", "1024"])
    yield url
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def gemma3_client(gemma3_server):
    """The official ``openai`` client of ``gemma3_server``."""
    import openai
    from test_server import DEADLINE_S

    return openai.OpenAI(base_url=gemma3_server + "/v1", api_key="unused", timeout=DEADLINE_S, max_retries=0)


@pytest.fixture(scope="session")
def gemma3_pipeline(tiny_gemma3_dir):
    """This package's float32 pipeline loaded from ``tiny_gemma3_dir``, with prompt chunks of two lengths only (128
    and 512 tokens: every short prompt of the suite is one 128-token chunk) and few step shapes
    (``few_step_shapes``), so that the 21 modules using it share a few compiled step programs instead of one per
    length bucket and batch their prompts happen to reach."""
    from omnijax.app.pipeline import Pipeline

    pipe = Pipeline.from_pretrained(tiny_gemma3_dir, dtype="float32")
    pipe.engine.buckets = (128, 512, pipe.engine.max_context)
    return few_step_shapes(pipe)


# Qwen3-Omni: tiny folders built by tests/fixtures/qwen3_omni_checkpoint.py (imported inside the fixtures, so sessions
# without Qwen tests do not import it).


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory):
    """A tiny Qwen3-Omni thinker folder (HF save_pretrained, float32, every parameter random) with its tokenizer,
    chat template, processor and generation files."""
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.build_tiny_thinker(tmp_path_factory.mktemp("tiny_qwen3_omni_thinker"))


@pytest.fixture(scope="session")
def tiny_qwen_full_dir(tmp_path_factory):
    """A tiny full Qwen3-Omni folder (thinker + talker + code2wav); its thinker tensors equal ``tiny_qwen_dir``'s."""
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.build_tiny_full_model(tmp_path_factory.mktemp("tiny_qwen3_omni_full"))


@pytest.fixture(scope="session")
def hf_qwen_thinker(tiny_qwen_dir):
    """The torch reference thinker loaded from ``tiny_qwen_dir``: float32, eager attention, eval mode."""
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.load_reference(tiny_qwen_dir)[0]


@pytest.fixture(scope="session")
def hf_qwen_processor(tiny_qwen_dir):
    """The HF processor for ``tiny_qwen_dir`` (a Qwen3OmniMoeProcessor, without video when torchvision is missing)."""
    import fixtures.qwen3_omni_checkpoint as qc

    return qc.load_processor(tiny_qwen_dir)


# The tiny Qwen3-Omni folders have 4-pixel patches: at the processor's default video frame size (over 131,072 pixels
# a frame) a frame would take thousands of tokens, so their pipelines size videos by the saved video processor
# settings (256 .. 4,096 pixels), and the video tests pass that size to transformers. The default size has its own
# tests (tests/test_qwen3_omni_video_size.py), on a variant with the published 16-pixel patches.
@pytest.fixture(scope="session")
def qwen_pipeline(tiny_qwen_dir):
    from omnijax.app.pipeline import Pipeline

    return few_step_shapes(Pipeline.from_pretrained(tiny_qwen_dir, video_size="checkpoint"))


@pytest.fixture(scope="session")
def qwen_speech_pipeline(tiny_qwen_full_dir):
    """``tiny_qwen_full_dir`` loaded with its talker and code2wav: it can answer aloud."""
    from omnijax.app.pipeline import Pipeline

    return few_step_shapes(Pipeline.from_pretrained(tiny_qwen_full_dir, video_size="checkpoint"))


@pytest.fixture(scope="session")
def hf_qwen_full(tiny_qwen_full_dir):
    """transformers' full model (thinker, talker, code2wav) from ``tiny_qwen_full_dir``: float32, eager, eval, with
    float32 matrix products at "highest" precision."""
    from fixtures.qwen3_omni_speech_reference import load_full_model

    return load_full_model(tiny_qwen_full_dir)


# ---------------------------------------------------------------------------------------------------------------
# Gemma 4: tiny folders built by tests/fixtures/gemma4_checkpoint.py (imported inside the fixtures, so sessions without
# Gemma 4 tests do not import it).


@pytest.fixture(scope="session")
def tiny_gemma4_small_dir(tmp_path_factory):
    """A tiny Gemma 4 folder in the small-model (E2B / E4B) layout: PLE, KV sharing, global head dim, vision with
    clipped linears, audio; tokenizer, chat template, processor and generation files."""
    import fixtures.gemma4_checkpoint as g4

    return g4.build_tiny_small(tmp_path_factory.mktemp("tiny_gemma4_small"))


@pytest.fixture(scope="session")
def tiny_gemma4_moe_dir(tmp_path_factory):
    """A tiny Gemma 4 folder in the mixture-of-experts (26B-A4B) layout: k_eq_v full layers with their own kv heads,
    bidirectional image blocks, standardized vision, no audio."""
    import fixtures.gemma4_checkpoint as g4

    return g4.build_tiny_moe(tmp_path_factory.mktemp("tiny_gemma4_moe"))


@pytest.fixture(scope="session")
def tiny_gemma4_text_dir(tmp_path_factory):
    """A tiny text-only Gemma 4 folder (Gemma4ForCausalLM, model_type gemma4_text), the small layout's text model."""
    import fixtures.gemma4_checkpoint as g4

    return g4.build_tiny_text_only(tmp_path_factory.mktemp("tiny_gemma4_text"))


@pytest.fixture(scope="session")
def hf_gemma4_small(tiny_gemma4_small_dir):
    """(torch model, processor) for ``tiny_gemma4_small_dir``: float32, eager attention, eval mode."""
    import fixtures.gemma4_checkpoint as g4

    return g4.load_reference(tiny_gemma4_small_dir)


@pytest.fixture(scope="session")
def hf_gemma4_moe(tiny_gemma4_moe_dir):
    """(torch model, processor) for ``tiny_gemma4_moe_dir``: float32, eager attention, eval mode."""
    import fixtures.gemma4_checkpoint as g4

    return g4.load_reference(tiny_gemma4_moe_dir)

# Llama 4: tiny folders built by tests/fixtures/llama4_checkpoint.py, and transformers' Llama 4 processors run once per
# session in a subprocess (tests/fixtures/llama4_reference.py: they need a torchvision this session must not see).


@pytest.fixture(scope="session")
def tiny_llama4_dir(tmp_path_factory):
    """A tiny Llama4ForConditionalGeneration folder (HF save_pretrained, float32, every parameter random) with its
    tokenizer, chat template, processor and generation files."""
    import fixtures.llama4_checkpoint as lc

    return lc.build_tiny_llama4(tmp_path_factory.mktemp("tiny_llama4"))


@pytest.fixture(scope="session")
def tiny_llama4_text_dir(tmp_path_factory):
    """A tiny text-only Llama4ForCausalLM folder (``model.*`` keys) with its tokenizer, chat template and generation
    files."""
    import fixtures.llama4_checkpoint as lc

    return lc.build_tiny_llama4_text(tmp_path_factory.mktemp("tiny_llama4_text"))


@pytest.fixture(scope="session")
def hf_llama4_model(tiny_llama4_dir):
    """The torch reference model of ``tiny_llama4_dir``: float32, eager attention, eval mode."""
    import fixtures.llama4_checkpoint as lc

    return lc.load_reference(tiny_llama4_dir)


@pytest.fixture(scope="session")
def hf_llama4_text_model(tiny_llama4_text_dir):
    """The torch reference model of ``tiny_llama4_text_dir``: float32, eager attention, eval mode."""
    import fixtures.llama4_checkpoint as lc

    return lc.load_reference(tiny_llama4_text_dir)


@pytest.fixture(scope="session")
def llama4_image_paths(tmp_path_factory):
    """name -> PNG path for the images of ``llama4_reference.IMAGE_SPECS`` and its size sweep."""
    import fixtures.llama4_reference as lr

    return lr.write_images(tmp_path_factory.mktemp("llama4_images"),
                           {**lr.IMAGE_SPECS, **lr.sweep_image_specs()})


@pytest.fixture(scope="session")
def llama4_reference(tiny_llama4_dir, llama4_image_paths, tmp_path_factory):
    """Outputs of transformers' Llama 4 image processor and processor for ``llama4_reference.reference_requests``
    (key -> numpy array, see tests/fixtures/llama4_reference_worker.py)."""
    import fixtures.llama4_reference as lr

    return lr.run_reference(lr.reference_requests(tiny_llama4_dir, llama4_image_paths),
                            tmp_path_factory.mktemp("llama4_reference"))


@pytest.fixture(scope="session")
def hf_gemma4_text(tiny_gemma4_text_dir):
    """The torch reference ``Gemma4ForCausalLM`` for ``tiny_gemma4_text_dir``: float32, eager attention, eval."""
    import fixtures.gemma4_checkpoint as g4

    return g4.load_reference(tiny_gemma4_text_dir)[0]


def _gemma4_pipeline(folder):
    """This package's float32 pipeline for ``folder``, with one prompt / cache length bucket and prompt chunks of
    up to 384 tokens (every prompt of the Gemma 4 tests is one chunk) so that they share a few compiled programs."""
    from omnijax.app.pipeline import Pipeline

    pipe = Pipeline.from_pretrained(folder, max_batched_tokens=384)
    pipe.engine.buckets = (384, pipe.engine.max_context)
    return few_step_shapes(pipe)


@pytest.fixture(scope="session")
def gemma4_small_pipeline(tiny_gemma4_small_dir):
    """Our pipeline for ``tiny_gemma4_small_dir`` (image + audio); see ``_gemma4_pipeline``."""
    return _gemma4_pipeline(tiny_gemma4_small_dir)


@pytest.fixture(scope="session")
def gemma4_moe_pipeline(tiny_gemma4_moe_dir):
    return _gemma4_pipeline(tiny_gemma4_moe_dir)


@pytest.fixture(scope="session")
def gemma4_text_pipeline(tiny_gemma4_text_dir):
    return _gemma4_pipeline(tiny_gemma4_text_dir)


@pytest.fixture(scope="session")
def llama4_pipeline(tiny_llama4_dir):
    """This package's float32 pipeline loaded from ``tiny_llama4_dir``, prefilling prompts in chunks of up to 128
    tokens (the long cases run in several)."""
    from omnijax.app.pipeline import Pipeline

    return few_step_shapes(Pipeline.from_pretrained(tiny_llama4_dir, max_batched_tokens=128))


@pytest.fixture(scope="session")
def llama4_text_pipeline(tiny_llama4_text_dir):
    """This package's float32 pipeline loaded from ``tiny_llama4_text_dir``."""
    from omnijax.app.pipeline import Pipeline

    return few_step_shapes(Pipeline.from_pretrained(tiny_llama4_text_dir))


# ---- media files for the web demo's tests

@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> str:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("web_media") / "photo.png"
    Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def broken_image(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("web_broken") / "broken.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    return str(path)
