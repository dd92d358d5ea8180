"""Generation benchmark: omnijax against transformers on the same random-weight checkpoint, same machine, one run.

    python -m bench.generation --family gemma3 [--out bench/results] [--repeats 5]

Measures, interleaved (omnijax, transformers, omnijax, ...) after warm-ups: time to first token for a 128- and a
512-token prompt with one image, image encode time, decode tokens/s at batch 1 and 8 (64 new tokens, greedy, EOS
ignored), peak resident memory (each system alone, in a subprocess), omnijax's first-call compile time and the
compilations a new prompt length inside a bucket triggers, and the machine's memory bandwidth. Writes
``generation-<family>-<time>.json`` (every raw figure plus the headline ratios at the top level) and a markdown
table beside it, and ``latest-<family>.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from bench.checkpoints import bench_checkpoint
from bench.chunk_scaling import scaling_figures

NEW_TOKENS = 64


def check_generated(shape: tuple, expected: tuple) -> None:
    """A timed generation must produce every token it was asked for (EOS ignored), or its timing is meaningless."""
    if tuple(shape) != tuple(expected):
        raise RuntimeError(f"generated tokens of shape {tuple(shape)}, expected {tuple(expected)}")


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def memory_bandwidth_gbs(repeats: int = 5) -> dict:
    """Bandwidth of the default JAX device from a matrix-vector product and a reduction over ~512 MB of float32."""
    import jax
    import jax.numpy as jnp

    rows, cols = 16384, 8192
    a = jax.device_put(jnp.ones((rows, cols), jnp.float32))
    v = jnp.ones((cols,), jnp.float32)
    matvec = jax.jit(lambda a, v: a @ v)
    reduce = jax.jit(lambda a: jnp.sum(a, axis=1))
    out = {}
    for name, fn, args in (("matvec", matvec, (a, v)), ("reduction", reduce, (a,))):
        fn(*args).block_until_ready()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*args).block_until_ready()
            times.append(time.perf_counter() - start)
        out[name] = a.nbytes / min(times) / 1e9
    return out


def weight_stream_s(weights: list, repeats: int = 3, steps: int = 8) -> float:
    """Seconds per pass of a chain of batch-1 matrix-vector products over ``weights`` ([out, in] arrays, each
    read once per pass, the next product waiting for the previous one), with no attention, norms or sampling:
    the fastest a decode step on these weights can be with XLA's matrix-vector products on this device."""
    chain = _weight_chain()
    chain(weights, steps=steps).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        chain(weights, steps=steps).block_until_ready()
        times.append((time.perf_counter() - start) / steps)
    return min(times)


@functools.cache
def _weight_chain():
    """The jitted chain (compiled once per weight shapes and step count, reused across rounds)."""
    import jax
    import jax.numpy as jnp

    def passes(weights: list, *, steps: int):
        def one_pass(_, carry):
            for w in weights:
                x = jnp.linspace(-1.0, 1.0, w.shape[1], dtype=w.dtype) * (1 + carry * 1e-9)
                carry = jax.lax.dot_general(x, w, (((0,), (1,)), ((), ())))[0]
            return carry

        return jax.lax.fori_loop(0, steps, one_pass, jnp.zeros((), weights[0].dtype))

    return jax.jit(passes, static_argnames="steps")


class Prompts:
    """The benchmark's inputs, prepared once with omnijax's processor and handed to both systems."""

    def __init__(self, pipe, image):
        self.pipe = pipe
        self.image = image

    def with_image(self, target_tokens: int):
        """An image prompt of exactly ``target_tokens`` tokens (filler text trimmed token by token)."""
        words = 1
        while True:
            messages = [{"role": "user", "content": [{"type": "image", "image": self.image},
                                                     {"type": "text", "text": " ".join(["word"] * words)}]}]
            prepared = self.pipe.prepare(messages)
            excess = len(prepared.token_ids) - target_tokens
            if excess >= 0:
                break
            words += max(1, -excess // 2)
        media_id = self.pipe.config.media_token_id("image")
        cut = int(np.flatnonzero(prepared.token_ids == media_id)[-1]) + 4  # into the filler after the image
        keep = np.r_[0:cut, cut + excess:len(prepared.token_ids)]
        prepared.token_ids = prepared.token_ids[keep]
        prepared.bidirectional = prepared.bidirectional[keep]
        if len(prepared.token_ids) != target_tokens:
            raise RuntimeError(f"the prompt has {len(prepared.token_ids)} tokens, not the {target_tokens} wanted")
        return prepared

    def text(self, words: int = 12):
        return self.pipe.prepare([{"role": "user", "content": " ".join(["hello"] * words)}])


class ProcessorOnly:
    """omnijax's prompt preparation without loading any weights (for measuring the other system alone)."""

    def __init__(self, folder):
        from omnijax.app.checkpoint import read_json
        from omnijax.app.families import family_for_config

        hf = read_json(pathlib.Path(folder), "config.json")
        spec = family_for_config(hf)
        self.config = spec.parse_config(hf)
        self.prepare = spec.make_processor(pathlib.Path(folder), self.config).prepare


def idle_expert_bytes(spec, decoder_params) -> int:
    """Bytes of mixture-of-experts weights a decoded token does not read: of each MoE layer's expert tensors
    (num_experts along the first axis), all but the top_k chosen experts."""
    idle = 0
    for i, layer in enumerate(spec.layers):
        if layer.ffn.kind == "moe":
            mlp = decoder_params["layers"][i]["mlp"]
            share = 1 - layer.ffn.top_k / layer.ffn.num_experts
            idle += int(sum(mlp[name].nbytes for name in ("gate_proj", "up_proj", "down_proj")) * share)
    return idle


def stacked_pixels(prompts) -> np.ndarray:
    """Every image item of the prompts as one [images or tiles, 3, H, W] array (an item is [3, H, W] or a stack of
    tiles [n, 3, H, W])."""
    items = [np.asarray(x) for p in prompts for x in p.media["image"]]
    return np.concatenate([x.reshape(-1, *x.shape[-3:]) for x in items])


OMNIJAX_SETTINGS = {"dtype": "float32", "quantize": None}  # --dtype / --quantize of this run (and its probes)


class OmnijaxRunner:
    name = "omnijax"

    def __init__(self, folder):
        from omnijax.app.pipeline import Pipeline

        start = time.perf_counter()
        # no prefix or media cache: every repeat of a prompt is prefilled and encoded again, as the peer does
        self.pipe = Pipeline.from_pretrained(folder, prefix_cache_mb=0, media_cache_mb=0, **OMNIJAX_SETTINGS)
        self.load_s = time.perf_counter() - start
        self.engine = self.pipe.engine
        decoder = self.engine.params["decoder"]
        leaves = __import__("jax").tree.leaves(decoder)
        self.total_weight_bytes = sum(x.nbytes for x in leaves)
        self.weight_bytes = self.total_weight_bytes - idle_expert_bytes(self.pipe.config.decoder, decoder)
        self.matrices = [x for x in leaves if x.ndim == 2]  # every [out, in] kernel and the (tied) embedding

    def generate(self, prompts, new_tokens):
        out = np.array([r.token_ids for r in self.pipe.generate_prepared(prompts, max_new_tokens=new_tokens,
                                                                          ignore_eos=True)])
        check_generated(out.shape, (len(prompts), new_tokens))
        return out

    def encode_image(self, prepared):
        import jax

        jax.block_until_ready(self.engine.encode({"image": prepared.media["image"]}))


class TransformersRunner:
    def __init__(self, folder, dtype: str):
        import torch
        from transformers import AutoModelForImageTextToText

        self.torch = torch
        self.dtype = getattr(torch, dtype)
        self.name = f"transformers_{dtype}"
        torch.set_num_threads(max(1, torch.get_num_threads()))
        start = time.perf_counter()
        self.model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=self.dtype).eval()
        self.load_s = time.perf_counter() - start

    def inputs(self, prompts):
        t = self.torch
        ids = t.tensor(np.stack([p.token_ids for p in prompts]).astype(np.int64))
        batch = {"input_ids": ids, "attention_mask": t.ones_like(ids)}
        if prompts[0].media.get("image"):
            batch["pixel_values"] = t.tensor(stacked_pixels(prompts)).to(self.dtype)
            if any(p.bidirectional.any() for p in prompts):  # bidirectional image blocks (Gemma 3's token types)
                batch["token_type_ids"] = t.tensor(np.stack([p.bidirectional for p in prompts]).astype(np.int64))
        return batch

    def generate(self, prompts, new_tokens):
        with self.torch.inference_mode():
            out = self.model.generate(**self.inputs(prompts), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False)
        check_generated(tuple(out.shape), (len(prompts), len(prompts[0].token_ids) + new_tokens))
        return out

    def encode_image(self, prepared):
        pixels = self.torch.tensor(stacked_pixels([prepared])).to(self.dtype)
        with self.torch.inference_mode():
            self.model.get_image_features(pixel_values=pixels)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def measure(runner, prompts: dict) -> dict:
    """One round of every measurement for one system (seconds; tokens/s for decode)."""
    out = {}
    for n in (128, 512):
        out[f"ttft_{n}_s"] = timed(runner.generate, [prompts[f"image_{n}"]], 1)
    out["image_encode_s"] = timed(runner.encode_image, prompts["image_128"])
    for b in (1, 8):
        batch = [prompts["text"]] * b
        first = timed(runner.generate, batch, 1)
        full = timed(runner.generate, batch, NEW_TOKENS)
        out[f"decode_b{b}_tok_s"] = b * (NEW_TOKENS - 1) / max(full - first, 1e-9)
    return out


def warm_up(runner, prompts: dict) -> None:
    for n in (128, 512):
        runner.generate([prompts[f"image_{n}"]], 1)
    runner.encode_image(prompts["image_128"])
    for b in (1, 8):
        runner.generate([prompts["text"]] * b, 1)
        runner.generate([prompts["text"]] * b, NEW_TOKENS)


def compile_figures(folder, prompts_fn) -> dict:
    """First-call compile time of a fresh omnijax engine and compilations caused by a new length in a bucket."""
    fresh = OmnijaxRunner(folder)
    prompts = prompts_fn(fresh.pipe)
    first_prompt, other = prompts["image_100"], prompts["image_120"]
    start = time.perf_counter()
    fresh.generate([first_prompt], 8)
    first = time.perf_counter() - start
    steady = min(timed(fresh.generate, [first_prompt], 8) for _ in range(2))
    before = fresh.pipe.compilations()
    if len(other.token_ids) == len(first_prompt.token_ids):
        raise RuntimeError("the second prompt must have another length to measure recompiles inside a bucket")
    fresh.generate([other], 8)
    return {"compile_s": first - steady, "first_call_s": first, "steady_call_s": steady,
            "recompiles_in_bucket": fresh.pipe.compilations() - before,
            "prompt_lengths": [len(first_prompt.token_ids), len(other.token_ids)]}


def memory_probe(system: str, folder: str) -> None:
    """Run in a subprocess: load one system, generate, print peak RSS in MB."""
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8))
    if system == "omnijax":
        runner = OmnijaxRunner(folder)
        prompt = Prompts(runner.pipe, image).with_image(512)
    else:
        prompt = Prompts(ProcessorOnly(folder), image).with_image(512)
        runner = TransformersRunner(folder, system.split("_", 1)[1])
    runner.generate([prompt], 16)
    print(json.dumps({"peak_rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM belongs to the process image (ru_maxrss on Linux carries the
    forking parent's peak across exec, which would charge the benchmark's own memory to the probe)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory(system: str, folder) -> float | None:
    proc = subprocess.run([sys.executable, "-m", "bench.generation", "--memory-probe", system, "--checkpoint",
                           str(folder), "--dtype", OMNIJAX_SETTINGS["dtype"],
                           "--quantize", OMNIJAX_SETTINGS["quantize"] or "none"],
                          capture_output=True, text=True, timeout=1800)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])["peak_rss_mb"] if proc.returncode == 0 and lines else None


def markdown(report: dict) -> str:
    r = report
    rm = r["ratios_of_medians"]
    sys_names = [s for s in r["systems"]]
    sc = r["chunk_scaling"]
    kv = sc["kv_cache_32k"]
    temps = " / ".join(f"{m['temp_bytes'] / 1e6:.0f}" for m in sc["chunk_temp_memory"])
    chunks = " / ".join(str(m["chunk"]) for m in sc["chunk_temp_memory"])
    short, long = sc["compile_short_context"], sc["compile_long_context"]
    active = "" if r["weight_bytes"] == r["total_weight_bytes"] else \
        f" ({r['weight_bytes'] / 1e6:.0f} MB read per decoded token: the roofline counts the active experts only)"
    rows = ["| measure | " + " | ".join(sys_names) + " |", "|---|" + "---|" * len(sys_names)]
    keys = ["ttft_128_s", "ttft_512_s", "image_encode_s", "decode_b1_tok_s", "decode_b8_tok_s"]
    for k in keys:
        cells = []
        for s in sys_names:
            m = r["systems"][s]["measures"][k]
            cells.append(f"{m['median']:.4g} ({m['min']:.4g}-{m['max']:.4g})")
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    rows.append("| peak_rss_mb | " + " | ".join(f"{r['systems'][s].get('peak_rss_mb') or float('nan'):.0f}"
                                               for s in sys_names) + " |")
    head = [f"# Generation benchmark: {r['family']} ({r['device']}, {r['date']})", "",
            f"omnijax weights: {r.get('omnijax_settings', {})}", "",
            f"Model: {r['params_millions']:.1f}M parameters, decoder weights {r['total_weight_bytes'] / 1e6:.0f} MB "
            f"float32{active}; "
            f"{r['repeats']} interleaved repeats, median (min-max). Headline ratios: the median of the ratios "
            f"measured within each round (ratio of the medians in brackets).", "",
            "| headline | value | target |", "|---|---|---|",
            f"| decode_b1_speedup | {r['decode_b1_speedup']:.2f}x ({rm['decode_b1_speedup']:.2f}x) | >= 1.25x |",
            f"| decode_b8_speedup | {r['decode_b8_speedup']:.2f}x ({rm['decode_b8_speedup']:.2f}x) | >= 1.5x |",
            f"| ttft512_ratio | {r['ttft512_ratio']:.2f} ({rm['ttft512_ratio']:.2f}) | <= 1.0 |",
            f"| decode_b1_roofline_fraction | {r['decode_b1_roofline_fraction']:.2f} "
            f"({rm['decode_b1_roofline_fraction']:.2f}) | >= 0.85 |",
            f"| recompiles_in_bucket | {r['recompiles_in_bucket']} | 0 |",
            f"| compile_s | {r['compile_s']:.1f} s | reported |",
            f"| bandwidth (matvec / reduction) | {r['bandwidth_gbs']['matvec']:.1f} / "
            f"{r['bandwidth_gbs']['reduction']:.1f} GB/s | |",
            f"| weights only: a chain of batch-1 matrix-vector products over the same weights, no attention "
            f"(fraction of roofline) | {r['weights_only']['roofline_fraction']:.2f} | diagnostic |",
            f"| decode batch 1 as a fraction of that chain | {r['weights_only']['decode_b1_fraction_of_it']:.2f} "
            f"| diagnostic |",
            f"| prompt-chunk program compile ({short['chunk']} tokens), {short['context']:,} / "
            f"{long['context']:,}-token context | {short['compile_s']:.1f} / {long['compile_s']:.1f} s (ratio "
            f"{sc['compile_ratio']:.2f}) | ratio <= 1.5 |",
            f"| prompt-chunk temporary memory, {chunks}-token chunks | {temps} MB | at most quadratic in the chunk |",
            f"| KV cache, 32k-token budget: allocated / minimum (full layers x length + local layers x window) | "
            f"{kv['allocated_bytes'] / 1e6:.0f} / {kv['minimum_bytes'] / 1e6:.0f} MB = {kv['ratio']:.2f}x "
            f"(one full-length cache per layer: {kv['full_length_cache_bytes'] / 1e6:.0f} MB) | <= 1.2x |", ""]
    return "\n".join(head + rows) + "\n"


def run(family: str, out_dir: pathlib.Path, repeats: int, smoke: bool, ckpt_root: pathlib.Path,
        with_bf16: bool, with_memory: bool) -> dict:
    import jax
    from PIL import Image

    folder = bench_checkpoint(family, ckpt_root, smoke=smoke)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8))

    def prompts_for(pipe):
        p = Prompts(pipe, image)
        # two lengths inside the same 128-token bucket for the recompilation check
        a, b = p.with_image(100), p.with_image(120)
        return {"image_128": p.with_image(128), "image_100": a, "image_120": b, "image_512": p.with_image(512),
                "text": p.text()}

    compile_info = compile_figures(folder, prompts_for)
    runners = [OmnijaxRunner(folder), TransformersRunner(folder, "float32")]
    if with_bf16:
        runners.append(TransformersRunner(folder, "bfloat16"))
    prompts = prompts_for(runners[0].pipe)
    scaling = scaling_figures(runners[0].pipe, **({"chunk": 64, "short": 128, "long": 512,
                                                   "chunk_lengths": (32, 64)} if smoke else {}))
    for r in runners:
        warm_up(r, prompts)
    rounds = {r.name: [] for r in runners}
    round_bandwidth, round_stream = [], []
    for _ in range(repeats):
        for r in runners:
            rounds[r.name].append(measure(r, prompts))
        round_bandwidth.append(memory_bandwidth_gbs(repeats=3))
        round_stream.append(weight_stream_s(runners[0].matrices))
    bandwidth = {k: float(np.median([b[k] for b in round_bandwidth])) for k in round_bandwidth[0]}
    weight_bytes = runners[0].weight_bytes
    systems = {}
    for r in runners:
        keys = rounds[r.name][0].keys()
        systems[r.name] = {"load_s": r.load_s,
                           "measures": {k: summary([m[k] for m in rounds[r.name]]) for k in keys}}
        if with_memory:
            systems[r.name]["peak_rss_mb"] = peak_memory(r.name, folder)
    med = lambda s, k: systems[s]["measures"][k]["median"]
    roofline = bandwidth["matvec"] * 1e9 / weight_bytes
    # The machine's speed drifts between rounds (shared host), so each headline ratio is the median of the ratios
    # taken within one round, where both systems (and the bandwidth) were measured back to back.
    ours, ref = rounds["omnijax"], rounds["transformers_float32"]
    paired = lambda k, num, den: float(np.median([num[i][k] / den[i][k] for i in range(repeats)]))
    roofline_fractions = [ours[i]["decode_b1_tok_s"] * weight_bytes / (round_bandwidth[i]["matvec"] * 1e9)
                          for i in range(repeats)]
    stream_bytes = sum(x.nbytes for x in runners[0].matrices)
    stream_fractions = [stream_bytes / round_stream[i] / (round_bandwidth[i]["matvec"] * 1e9) for i in range(repeats)]
    dev = jax.devices()[0]
    report = {
        "family": family, "smoke": smoke, "omnijax_settings": dict(OMNIJAX_SETTINGS),
        "decode_b1_speedup": paired("decode_b1_tok_s", ours, ref),
        "decode_b8_speedup": paired("decode_b8_tok_s", ours, ref),
        "ttft512_ratio": paired("ttft_512_s", ours, ref),
        "decode_b1_roofline_fraction": float(np.median(roofline_fractions)),
        "recompiles_in_bucket": compile_info["recompiles_in_bucket"],
        "compile_s": compile_info["compile_s"],
        "ratio_method": "median over rounds of the ratio within a round (both systems measured back to back)",
        "ratios_of_medians": {
            "decode_b1_speedup": med("omnijax", "decode_b1_tok_s") / med("transformers_float32", "decode_b1_tok_s"),
            "decode_b8_speedup": med("omnijax", "decode_b8_tok_s") / med("transformers_float32", "decode_b8_tok_s"),
            "ttft512_ratio": med("omnijax", "ttft_512_s") / med("transformers_float32", "ttft_512_s"),
            "decode_b1_roofline_fraction": med("omnijax", "decode_b1_tok_s") / roofline},
        "roofline_tok_s": roofline, "bandwidth_gbs": bandwidth, "round_bandwidth_gbs": round_bandwidth,
        # diagnostic: the decoder's matrices alone, streamed by a chain of batch-1 matrix-vector products
        "weights_only": {"roofline_fraction": float(np.median(stream_fractions)),
                         "decode_b1_fraction_of_it": float(np.median(
                             [ours[i]["decode_b1_tok_s"] * round_stream[i] for i in range(repeats)])),
                         "round_pass_s": round_stream, "matrix_bytes": stream_bytes,
                         "method": "chain of batch-1 matrix-vector products over the decoder's 2-D weights, "
                                   "as a fraction of the bandwidth roofline (same round's bandwidth)"},
        "weight_bytes": weight_bytes, "total_weight_bytes": runners[0].total_weight_bytes,
        "params_millions": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(runners[0].engine.params)) / 1e6,
        "prompt_tokens": {k: len(v.token_ids) for k, v in prompts.items()},
        "new_tokens": NEW_TOKENS, "repeats": repeats, "compile": compile_info, "systems": systems,
        "chunk_scaling": scaling,
        "device": f"{dev.platform}:{dev.device_kind}", "roofline_memory": "HBM" if dev.platform == "gpu" else "DRAM",
        "host": platform.node(), "cpu_count": __import__("os").cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "checkpoint": str(folder),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out_dir / f"generation-{family}-{stamp}.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out_dir / f"generation-{family}-{stamp}.md").write_text(table)
    (out_dir / f"latest-{family}.md").write_text(table)
    (out_dir / f"latest-{family}.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.generation", description=__doc__.splitlines()[0])
    p.add_argument("--family", default="gemma3")
    p.add_argument("--out", default="bench/results", help="folder for the JSON report and markdown table")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny model, one repeat: checks the report, not speed")
    p.add_argument("--checkpoints", default=str(pathlib.Path.home() / ".cache" / "omnijax" / "bench"),
                   help="where benchmark checkpoints are built and reused")
    p.add_argument("--no-bf16", action="store_true", help="skip transformers in bfloat16")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--dtype", default="float32", help="omnijax's weight dtype (default float32)")
    p.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                   help="omnijax's decoder weights quantized (int8 experts for the MoE families)")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    OMNIJAX_SETTINGS.update(dtype=args.dtype, quantize=None if args.quantize == "none" else args.quantize)
    try:
        import torch  # noqa: F401 (transformers runs the reference side on PyTorch)
    except ImportError:
        print("python -m bench.generation: the benchmark compares omnijax with transformers, which runs on PyTorch, "
              "and PyTorch is not installed: install the test extra (pip install -e '.[test]'; see the README's "
              "Tests section for a CPU-only PyTorch)", file=sys.stderr)
        return 2
    if args.memory_probe:
        memory_probe(args.memory_probe, args.checkpoint)
        return 0
    report = run(args.family, pathlib.Path(args.out), 1 if args.smoke else args.repeats, args.smoke,
                 pathlib.Path(args.checkpoints), not args.no_bf16, not args.no_memory)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
