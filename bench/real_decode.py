"""Real-model decode benchmark: Gemma 3 270M (the Q4_K_M GGUF of the test extra), batch-1 greedy decode, omnijax
(int8, int4, bfloat16, float32 weights) against llama.cpp (llama-cpp-python, the ``bench`` extra) on the same file.

    python -m bench.real_decode [--out bench/results] [--rounds 2] [--threads 2] [--new-tokens 128]
                                [--systems llama.cpp,omnijax-int8,...] [--gguf FILE] [--smoke]

Every measurement runs in its own process (one system, one setting), so each peak resident memory (VmHWM) is that
system's alone; the systems take turns in each round (llama.cpp, then each omnijax setting), after one warm-up
process each (which builds what is cached between runs: the GGUF tokenizer, compiled programs, omnijax's converted
weights in a weight cache of the run's own: its load time is reported as the first load), so every other load time
is a second run's. omnijax serves one request with a context of ``CONTEXT`` tokens, as llama.cpp is given
(``n_ctx``): the runtime's caches are sized alike. Peak resident memory is read right after the load
(``load_peak_rss_mb``) and at the end (``peak_rss_mb``: load and decode). A process loads the model (timed:
``load_s``), generates once to warm up, then generates ``--new-tokens`` tokens from the same prompt (EOS ignored),
noting when each token arrives: time to first token from the call, decode tokens/s = (new tokens - 1) / (last
arrival - first arrival). Headline ratios are taken within each round (the machine is shared: its speed drifts) and their
median reported. Writes ``real-decode-<time>.json`` and ``latest-real-decode.md`` / ``.json`` into ``--out``.
``--smoke`` (the tests' run on a tiny GGUF file): one round, no warm-up processes, a few tokens; it checks the code
path and the report, never the speed. The report names the CPU and its vector-instruction flags (the figures depend
on them) and the instruction set omnijax's CPU kernels took.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

PROMPT = "The history of the city begins with a small settlement by the river, where"
# the flags that decide what the products of either system can use
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
              "amx_int8", "asimd", "sve")
CONTEXT = 512  # llama.cpp's n_ctx, and omnijax's max_context (one request at a time: max_batch 1)
OMNIJAX_SETTINGS = (("int8", "float32", "int8"), ("int4", "float32", "int4"), ("bfloat16", "bfloat16", None),
                    ("float32", "float32", None))


def cpu_description() -> str:
    """The CPU's model name and which of SIMD_FLAGS it has, e.g. ``AMD EPYC 9R14 (avx2 fma ... avx512_bf16)``."""
    from omnijax.common.cpu import cpu_flags

    model = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    return f"{model} ({' '.join(f for f in SIMD_FLAGS if f in flags) or 'no SIMD flags read'})"


def peak_rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed_decode(run, new_tokens: int) -> dict:
    """Time ``run(n) -> (token ids, the time.perf_counter() at which each token arrived)`` for ``new_tokens``
    tokens: the first token's time from the call, and decode tokens/s = (tokens - 1) / (last arrival - first
    arrival), both from the same run."""
    start = time.perf_counter()
    tokens, times = run(new_tokens)
    return {"ttft_s": times[0] - start, "decode_tok_s": (len(times) - 1) / (times[-1] - times[0]),
            "tokens": tokens}


def probe_llama_cpp(path: str, new_tokens: int, threads: int) -> dict:
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=CONTEXT, verbose=False)
    load_s = time.perf_counter() - start
    load_peak = peak_rss_mb()
    prompt = llm.tokenize(PROMPT.encode(), add_bos=True)

    def run(n: int) -> tuple[list[int], list[float]]:
        llm.reset()
        out, times = [], []
        for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            times.append(time.perf_counter())
            if len(out) == n:
                break
        return out, times

    run(4)
    return dict(timed_decode(run, new_tokens), load_s=load_s, load_peak_rss_mb=load_peak, peak_rss_mb=peak_rss_mb())


def probe_omnijax(path: str, new_tokens: int, dtype: str, quantize: str | None) -> dict:
    import jax

    from omnijax.app.pipeline import Pipeline
    from omnijax.common.kernels import native_library

    start = time.perf_counter()
    pipe = Pipeline.from_pretrained(path, dtype=dtype, quantize=quantize, max_batch=1, max_context=CONTEXT)
    load_s = time.perf_counter() - start
    load_peak = peak_rss_mb()
    prompt = pipe.prepare_raw(PROMPT)

    def run(n: int) -> tuple[list[int], list[float]]:
        out, times = [], []
        for event in pipe.submit(prompt, max_new_tokens=n, ignore_eos=True).events():
            if event.token_id is not None:
                out.append(event.token_id)
                times.append(time.perf_counter())
        return out, times

    run(new_tokens)  # compiles (or reads the compiled programs back from the cache) what the run needs
    result = timed_decode(run, new_tokens)
    weights = sum(x.nbytes for x in jax.tree.leaves(pipe.engine.params["decoder"]))
    return dict(result, load_s=load_s, load_peak_rss_mb=load_peak, peak_rss_mb=peak_rss_mb(),
                decoder_weight_mb=weights / 2**20,
                kernels=native_library.chosen_isa() or "missing")


def measure(system: str, path, new_tokens: int, threads: int, env: dict | None = None) -> dict:
    """One probe in a fresh process (``threads`` CPU threads for llama.cpp; XLA uses the machine's cores)."""
    cmd = [sys.executable, "-m", "bench.real_decode", "--probe", system, "--gguf", str(path),
           "--new-tokens", str(new_tokens), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{system} probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


SYSTEMS = ["llama.cpp"] + [f"omnijax-{name}" for name, _, _ in OMNIJAX_SETTINGS]
PEER = "llama.cpp"


def markdown(report: dict) -> str:
    lines = [f"# Real Gemma 3 270M (Q4_K_M GGUF), batch-1 greedy decode ({report['machine']}, {report['date']})", "",
             f"{report['new_tokens']} new tokens, llama.cpp with {report['threads']} threads; {report['rounds']} "
             f"interleaved rounds, each process alone; median (min-max). Ratios: median over rounds of the ratio "
             f"within the round.", "", f"CPU: {report['cpu']}; omnijax's CPU kernels: {report['kernels']}.", "",
             "| system | decode tok/s | ratio to llama.cpp | peak RSS MB (load and decode) | RSS ratio | "
             "peak RSS MB after load | load s (second run) | load s (first run) | decoder weights MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in report["systems"]:
        s = report["systems"][name]
        tok = s["decode_tok_s"]
        ratio = report["ratios"].get(name, {})
        lines.append(f"| {name} | {tok['median']:.1f} ({tok['min']:.1f}-{tok['max']:.1f}) | "
                     f"{ratio.get('decode', 1.0):.2f}x | {s['peak_rss_mb']['max']:.0f} | "
                     f"{ratio.get('rss', 1.0):.2f} | {s['load_peak_rss_mb']['max']:.0f} | "
                     f"{s['load_s']['median']:.2f} | {s.get('first_load_s', float('nan')):.2f} | "
                     f"{s.get('decoder_weight_mb', float('nan')):.0f} |")
    lines += ["", "Targets: decode >= 1.2x llama.cpp's with int4 and >= 1.0x with int8, peak RSS <= 1.5x llama.cpp's, "
                  "load <= 2 s."]
    if report["agreement"]:
        lines.append("Greedy tokens agree with llama.cpp's for the first "
                     + ", ".join(f"{n}: {report['agreement'][n]}" for n in report["agreement"]) + " tokens.")
    else:
        lines.append("(llama.cpp was not run: no ratios.)")
    return "\n".join(lines) + "\n"


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def run(out: pathlib.Path, rounds: int, threads: int, new_tokens: int, systems: list[str] = SYSTEMS,
        path: pathlib.Path | None = None, warm_up: bool = True) -> dict:
    """Measure ``systems`` on the GGUF file ``path`` (default: the real 270M) and write the report."""
    if path is None:
        from bench.real_gemma3 import gemma3_270m_gguf

        path = gemma3_270m_gguf()
    import shutil
    import tempfile

    weights = tempfile.mkdtemp(prefix="omnijax-bench-weights-")  # the run's own weight cache (converted weights)
    env = dict(os.environ, OMNIJAX_WEIGHT_CACHE_DIR=weights)
    first = {}
    results = {name: [] for name in systems}
    try:
        if warm_up:
            for name in systems:  # builds the caches a second run reads
                first[name] = measure(name, path, 8, threads, env)["load_s"]
        for _ in range(rounds):
            for name in systems:
                results[name].append(measure(name, path, new_tokens, threads, env))
    finally:
        shutil.rmtree(weights, ignore_errors=True)
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "rounds": rounds, "threads": threads, "new_tokens": new_tokens, "gguf": str(path), "systems": {},
              "ratios": {}, "agreement": {}, "cpu": cpu_description(),
              "kernels": next((r[0]["kernels"] for r in results.values() if "kernels" in r[0]), "not run")}
    for name, runs in results.items():
        entry = {k: summary([r[k] for r in runs])
                 for k in ("decode_tok_s", "peak_rss_mb", "load_peak_rss_mb", "load_s", "ttft_s")}
        if name in first:
            entry["first_load_s"] = first[name]
        if "decoder_weight_mb" in runs[0]:
            entry["decoder_weight_mb"] = runs[0]["decoder_weight_mb"]
        entry["tokens"] = runs[0]["tokens"]
        report["systems"][name] = entry
        if PEER not in results:
            continue
        ref = results[PEER]
        report["ratios"][name] = {
            "decode": statistics.median(r["decode_tok_s"] / b["decode_tok_s"] for r, b in zip(runs, ref)),
            "rss": statistics.median(r["peak_rss_mb"] / b["peak_rss_mb"] for r, b in zip(runs, ref))}
        same = 0
        for a, b in zip(runs[0]["tokens"], ref[0]["tokens"]):
            if a != b:
                break
            same += 1
        report["agreement"][name] = same
    out.mkdir(parents=True, exist_ok=True)
    (out / f"real-decode-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))
    (out / "latest-real-decode.json").write_text(json.dumps(report, indent=1))
    (out / "latest-real-decode.md").write_text(markdown(report))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_decode", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="which to run, comma-separated (default: all)")
    p.add_argument("--gguf", help="the GGUF file (default: the real Gemma 3 270M of the test extra)")
    p.add_argument("--smoke", action="store_true", help="one round, 4 new tokens, no warm-up: checks the code path")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        if args.probe == "llama.cpp":
            result = probe_llama_cpp(args.gguf, args.new_tokens, args.threads)
        else:
            name = args.probe.split("-", 1)[1]
            _, dtype, quantize = next(s for s in OMNIJAX_SETTINGS if s[0] == name)
            result = probe_omnijax(args.gguf, args.new_tokens, dtype, quantize)
        print(json.dumps(result))
        return 0
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        print(f"python -m bench.real_decode: unknown systems {unknown}; choose from {', '.join(SYSTEMS)}",
              file=sys.stderr)
        return 2
    if PEER in systems:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("python -m bench.real_decode: llama.cpp's Python binding is not installed: pip install -e "
                  "'.[bench]' (or leave llama.cpp out of --systems)", file=sys.stderr)
            return 2
    rounds, new_tokens = (1, 4) if args.smoke else (args.rounds, args.new_tokens)
    print(markdown(run(pathlib.Path(args.out), rounds, args.threads, new_tokens, systems,
                       pathlib.Path(args.gguf) if args.gguf else None, warm_up=not args.smoke)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
