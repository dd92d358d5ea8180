"""Load benchmark: time and peak memory of ``Pipeline.from_pretrained`` on the real Gemma 3 270M checkpoint.

    python -m bench.load [--out bench/results] [--repeats 2] [--gguf FILE]

Loads the Q4_K_M GGUF file (dequantized into float32 and into bfloat16, and quantized to int8 and int4) and, for
comparison, the float32 safetensors folder transformers saves from it (bench/real_gemma3.py), each in a fresh
subprocess: first with an empty weight cache (app/weight_cache.py: a folder of the run's own; ``first_load_s``,
the conversion), then ``--repeats`` times reading it back (a second load: the figures below are those). The
tokenizer cache and the compilation cache are the user's, as a user's second run finds them. Reports:
load_s (the whole ``from_pretrained``: header, config, tokenizer, weights, engine), weights_s (reading,
converting or reading back, and placing the weights), peak_rss_mb (the process's VmHWM over the load, imports included),
peak_before_weights_mb (the same before the weights: imports, config, tokenizer), rss_before_weights_mb, weights_peak_mb (how far resident memory rose above that while the weights streamed in:
the peak is reset just before) against weights_mb (the loaded parameters) and largest_tensor_mb. Writes
``load-<time>.json``, ``latest-load.json`` and ``latest-load.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

MB = 1 << 20


SETTINGS = ("float32", "bfloat16", "int8", "int4")  # the GGUF loads measured: dtype, or float32 quantized

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Reset VmHWM to the current resident size (Linux: write 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def probe(path: str, dtype: str, quantize: str | None = None) -> dict:
    """Load ``path`` in this process and measure it (run it in a fresh process: see ``measure``)."""
    start = time.perf_counter()
    import jax

    import omnijax.app.pipeline as pipeline_module

    jax.devices()
    imports_s = time.perf_counter() - start
    stage: dict = {}
    real_load = pipeline_module.load_weights

    def measured_load(*args, **kwargs):
        stage["peak_before_weights_kb"] = _status_kb("VmHWM")
        stage["rss_before_weights_kb"] = _status_kb("VmRSS")
        _reset_peak()
        t = time.perf_counter()
        params = jax.block_until_ready(real_load(*args, **kwargs))
        stage["weights_s"] = time.perf_counter() - t
        stage["weights_peak_kb"] = _status_kb("VmHWM")
        return params

    pipeline_module.load_weights = measured_load
    t = time.perf_counter()
    pipe = pipeline_module.Pipeline.from_pretrained(path, dtype=dtype, quantize=quantize)
    load_s = time.perf_counter() - t
    leaves = jax.tree.leaves(pipe.engine.params)
    return {
        "path": str(path), "dtype": dtype, "quantize": quantize, "imports_s": imports_s, "load_s": load_s,
        "weights_s": stage["weights_s"],
        "peak_rss_mb": max(stage["peak_before_weights_kb"], _status_kb("VmHWM")) / 1024,
        "peak_before_weights_mb": stage["peak_before_weights_kb"] / 1024,
        "rss_before_weights_mb": stage["rss_before_weights_kb"] / 1024,
        "weights_peak_mb": (stage["weights_peak_kb"] - stage["rss_before_weights_kb"]) / 1024,
        "weights_mb": sum(x.nbytes for x in leaves) / MB,
        "largest_tensor_mb": max(x.nbytes for x in leaves) / MB,
        "rss_after_mb": _status_kb("VmRSS") / 1024,
    }


def measure(path, dtype: str, env: dict | None = None, quantize: str | None = None) -> dict:
    """``probe`` in a fresh Python process."""
    cmd = [sys.executable, "-m", "bench.load", "--probe", str(path), "--dtype", dtype]
    proc = subprocess.run(cmd + (["--quantize", quantize] if quantize else []), capture_output=True, text=True,
                          env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"load probe failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(report: dict) -> str:
    lines = [f"# Load: {report['gguf']} ({report['machine']})", "",
             f"CPU: {report.get('cpu', '?')}", "",
             "| checkpoint | setting | first load s | load s | weights s | peak RSS MB | peak before weights MB | "
             "RSS before weights MB | rise while weights stream MB | weights MB | largest tensor MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['checkpoint']} | {r.get('quantize') or r['dtype']} | "
                     f"{r.get('first_load_s', float('nan')):.2f} | {r['load_s']:.2f} | {r['weights_s']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['peak_before_weights_mb']:.0f} | "
                     f"{r['rss_before_weights_mb']:.0f} | {r['weights_peak_mb']:.0f} | "
                     f"{r['weights_mb']:.0f} | {r['largest_tensor_mb']:.0f} |")
    lines += ["", "First load: an empty weight cache (the conversion); the other figures: the best (time) / largest "
                  "(memory) of the second loads, each in a fresh process."]
    return "\n".join(lines) + "\n"


def run(out: pathlib.Path, repeats: int, gguf: pathlib.Path | None = None,
        settings: tuple[str, ...] | None = None) -> dict:
    """Measure the loads of ``gguf`` (default: the real 270M) and of its safetensors conversion; write the report."""
    from bench.real_decode import cpu_description
    from bench.real_gemma3 import gemma3_270m_gguf, reference_folder

    gguf = gguf or gemma3_270m_gguf()
    settings = SETTINGS if settings is None else settings
    loads = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8": ("float32", "int8"),
             "int4": ("float32", "int4")}
    cases = [("GGUF", gguf, *loads[name]) for name in settings]
    cases.append(("safetensors (from the GGUF)", reference_folder(gguf), "float32", None))
    runs = []
    for name, path, dtype, quantize in cases:
        folder = tempfile.mkdtemp(prefix="omnijax-bench-weights-")
        env = dict(os.environ, OMNIJAX_WEIGHT_CACHE_DIR=folder)
        try:
            first = measure(path, dtype, env, quantize)
            samples = [measure(path, dtype, env, quantize) for _ in range(repeats)]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        best = dict(samples[0], checkpoint=name, first_load_s=first["load_s"], first_peak_rss_mb=first["peak_rss_mb"])
        for key in ("load_s", "weights_s", "imports_s"):
            best[key] = min(s[key] for s in samples)
        for key in ("peak_rss_mb", "peak_before_weights_mb", "weights_peak_mb", "rss_before_weights_mb"):
            best[key] = max(s[key] for s in samples)
        best["samples"] = samples
        runs.append(best)
    report = {"machine": f"{platform.machine()}, {platform.processor() or platform.system()}", "cpu": cpu_description(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "gguf": gguf.name, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"load-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))
    (out / "latest-load.json").write_text(json.dumps(report, indent=1))
    (out / "latest-load.md").write_text(markdown(report))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gguf", help="a Gemma 3 GGUF file (default: the real 270M of the test extra)")
    p.add_argument("--settings", default=",".join(SETTINGS),
                   help=f"the GGUF loads to measure, of {', '.join(SETTINGS)} (default all; the safetensors "
                        f"conversion is always measured)")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--quantize", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.dtype, args.quantize)))
        return 0
    settings = tuple(s for s in args.settings.split(",") if s)
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        p.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    print(markdown(run(pathlib.Path(args.out), args.repeats, pathlib.Path(args.gguf) if args.gguf else None,
                       settings)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
