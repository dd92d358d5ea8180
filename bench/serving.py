"""Serving benchmark: many requests at once on the serving engine, against one request at a time and against
lockstep batches (a batch starts together and ends with its longest request), in one run.

    python -m bench.serving --model bench      # the ~140M Gemma-3-shaped bench checkpoint (bench/checkpoints.py)
    python -m bench.serving --model real       # Google's Gemma 3 270M, the Q4_K_M GGUF of the test extra
    python -m bench.serving --model smoke --requests 2   # the tests' run: a few-MB model, a few tokens each,
                                                         # nothing run first to compile (its times include it)

Measured (greedy, end ids ignored so every request generates its budget; prefix and media caches off except for
the chat figure):
- throughput: N requests of mixed prompt (32..600 tokens) and output (16..128 tokens) lengths all arriving at
  once: aggregate generated tokens/s and time to first token (p50, p99, from the arrival) for continuous
  batching, one request at a time, and lockstep batches of the same size;
- a short request arriving while 8 long ones decode: its whole time against theirs;
- a chat's second turn (the first turn's prompt and answer plus a new question) with the prefix cache: its time to
  first token against the first turn's;
- at the server's defaults (no settings: its slots, context, step token budget and caches): 32 short requests at
  once (time to first token p50 / p99), and a short request arriving just after one with a ~4k-token prompt (its
  time to first token against the long one's: the engine runs the short prompt beside the long one's chunks);
- what bounds the throughput ratio: the same prompts processed alone (one new token each; no batching shortens
  this work), so one-at-a-time seconds / these seconds is the most any batching could give on this workload, and
  the machine's float32 product rate at 1, 16 and 512 rows (what a decode step of 1 or 16 rows and a prompt chunk
  multiply at).
Targets (2-core CPU): throughput >= 3x one at a time; the short request under a quarter of the long ones' time;
the second turn's time to first token <= 0.3x the first's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import platform
import sys
import time

import numpy as np

WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on quiet town and wind moves grass near old "
         "river bridge where children play games every summer evening under tall trees").split()


def text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, words))


def chat(pipe, content: str) -> list[dict] | str:
    """A user message, or the raw text for a model without a chat template."""
    return [{"role": "user", "content": content}] if pipe.has_chat_template else content


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The workload's lengths: prompt words and new tokens of the mixed requests, the long requests' and the short
    one's prompt words and new tokens, a chat's system prompt words, and the engine's context."""
    words: tuple[int, int] = (10, 205)
    new_tokens: tuple[int, int] = (16, 129)
    long: tuple[int, int] = (60, 256)
    short: tuple[int, int] = (20, 8)
    system_words: int = 300
    context: int = 2048
    prefill_words: int = 3000  # the long prompt a short request arrives behind (about 4k tokens)
    many_short: int = 32  # short requests arriving at once at the defaults


SIZES = {"bench": Sizes(), "real": Sizes(),
         # the tests' run: the same code path at a few tokens each (it checks the report, never the speed)
         "smoke": Sizes(words=(4, 20), new_tokens=(2, 6), long=(8, 12), short=(4, 2), system_words=30, context=512,
                        prefill_words=200, many_short=4)}


def workload(pipe, n: int, seed: int = 0, sizes: Sizes = Sizes()) -> list[tuple]:
    """n (prepared prompt, new tokens) pairs of mixed lengths."""
    rng = np.random.default_rng(seed)
    return [(pipe.prepare(chat(pipe, text(rng, int(rng.integers(*sizes.words))))),
             int(rng.integers(*sizes.new_tokens))) for _ in range(n)]


def _submit(pipe, prompt, new_tokens):
    return pipe.submit(prompt, max_new_tokens=new_tokens, ignore_eos=True)


def _figures(t0: float, handles: list, end: float) -> dict:
    results = [h.result() for h in handles]
    ttft = [h.submitted + r.first_token_seconds - t0 for h, r in zip(handles, results)]
    tokens = sum(len(r.token_ids) for r in results)
    return {"tokens": tokens, "seconds": end - t0, "tok_s": tokens / (end - t0),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99))}


def continuous(pipe, work) -> dict:
    t0 = time.perf_counter()
    handles = [_submit(pipe, p, n) for p, n in work]
    for h in handles:
        h.result()
    return _figures(t0, handles, time.perf_counter())


def one_at_a_time(pipe, work) -> dict:
    t0 = time.perf_counter()
    handles = []
    for p, n in work:
        handles.append(_submit(pipe, p, n))
        handles[-1].result()
    return _figures(t0, handles, time.perf_counter())


def lockstep(pipe, work, batch: int) -> dict:
    """Batches of ``batch`` requests, each starting when the previous batch has wholly ended."""
    t0 = time.perf_counter()
    handles = []
    for i in range(0, len(work), batch):
        group = [_submit(pipe, p, n) for p, n in work[i:i + batch]]
        for h in group:
            h.result()
        handles += group
    return _figures(t0, handles, time.perf_counter())


def prompts_alone(pipe, work) -> dict:
    """Each prompt of ``work`` alone with one new token: the prompt processing every mode has to do."""
    t0 = time.perf_counter()
    for p, _ in work:
        _submit(pipe, p, 1).result()
    return {"prompt_tokens": sum(len(p.token_ids) for p, _ in work), "seconds": time.perf_counter() - t0}


def product_rates(d: int = 768, f: int = 3072, rounds: int = 20) -> dict:
    """GFLOP/s of a float32 [rows, d] x [d, f] product under XLA at 1, 16 and 512 rows."""
    import jax
    import jax.numpy as jnp

    w = jnp.asarray(np.random.default_rng(0).standard_normal((f, d), np.float32))
    product = jax.jit(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))))
    out = {}
    for rows in (1, 16, 512):
        x = jnp.ones((rows, d), jnp.float32)
        product(x, w).block_until_ready()
        start = time.perf_counter()
        for _ in range(rounds):
            y = product(x, w)
        y.block_until_ready()
        out[rows] = 2 * rows * d * f * rounds / (time.perf_counter() - start) / 1e9
    return out


def short_among_long(pipe, seed: int = 1, sizes: Sizes = Sizes()) -> dict:
    """8 long requests (256 tokens) decoding; a short one (8 tokens) arrives once all of them have started."""
    rng = np.random.default_rng(seed)
    long = [_submit(pipe, pipe.prepare(chat(pipe, text(rng, sizes.long[0]))), sizes.long[1]) for _ in range(8)]
    for h in long:
        next(h.events())
    start = time.perf_counter()
    short = _submit(pipe, pipe.prepare(chat(pipe, text(rng, sizes.short[0]))), sizes.short[1])
    short.result()
    short_s = time.perf_counter() - start
    long_s = float(np.mean([h.result().seconds for h in long]))
    return {"short_s": short_s, "long_s": long_s, "ratio": short_s / long_s}


def _timed(pipe, prompt) -> tuple[float, object]:
    """(seconds from the call to the first token, the result) of one greedy 32-token answer."""
    start = time.perf_counter()
    handle = pipe.submit(prompt, max_new_tokens=32)
    next(handle.events())
    ttft = time.perf_counter() - start
    return ttft, handle.result()


def chat_turns(pipe, seed: int = 2, sizes: Sizes = Sizes()) -> dict:
    """Time to first token (from the call) of a second chat turn (prefix cached) against the first's, median of
    three chats; the engine is idle before each turn."""
    rng = np.random.default_rng(seed)
    ratios, first, second = [], [], []
    for _ in range(3):
        system, q1, q2 = text(rng, sizes.system_words), text(rng, 20), text(rng, 20)
        if pipe.has_chat_template:
            turn1 = [{"role": "system", "content": system}, {"role": "user", "content": q1}]
            t1, a = _timed(pipe, turn1)
            turn2 = turn1 + [{"role": "assistant", "content": a.text}, {"role": "user", "content": q2}]
        else:
            turn1 = system + "\n" + q1
            t1, a = _timed(pipe, pipe.prepare_raw(turn1))
            turn2 = turn1 + a.text + "\n" + q2
        while not pipe.scheduler.idle:  # the first turn's last step read back: the second starts on an idle engine
            time.sleep(0.001)
        t2, _ = _timed(pipe, turn2 if pipe.has_chat_template else pipe.prepare_raw(turn2))
        first.append(t1)
        second.append(t2)
        ratios.append(t2 / t1)
    return {"first_turn_ttft_s": float(np.median(first)), "second_turn_ttft_s": float(np.median(second)),
            "ratio": float(np.median(ratios))}


def many_short(pipe, n: int = 32, seed: int = 4, sizes: Sizes = Sizes()) -> dict:
    """``n`` short requests arriving at once: time to first token p50 / p99 and the seconds until the last ends."""
    rng = np.random.default_rng(seed)
    work = [(pipe.prepare(chat(pipe, text(rng, sizes.short[0]))), sizes.short[1]) for _ in range(n)]
    return continuous(pipe, work)


def behind_long_prefill(pipe, seed: int = 5, sizes: Sizes = Sizes()) -> dict:
    """A short request submitted just after one with a long prompt (both 8 new tokens): the times to first token
    from their submissions."""
    rng = np.random.default_rng(seed)
    long_prompt = pipe.prepare(chat(pipe, text(rng, sizes.prefill_words)))
    short_prompt = pipe.prepare(chat(pipe, text(rng, sizes.short[0])))
    long = _submit(pipe, long_prompt, sizes.short[1])
    short = _submit(pipe, short_prompt, sizes.short[1])
    long_r, short_r = long.result(), short.result()
    return {"long_prompt_tokens": len(long_prompt.token_ids), "long_ttft_s": long_r.first_token_seconds,
            "short_ttft_s": short_r.first_token_seconds, "long_cached_tokens": long_r.cached_tokens,
            "ratio": short_r.first_token_seconds / long_r.first_token_seconds}


def at_defaults(folder, sizes: Sizes, warm: bool = True) -> dict:
    """The server's defaults: many short requests, and one behind a long prompt (each run twice, the second
    measured: the first compiles; once with ``warm`` False)."""
    from omnijax.app.pipeline import Pipeline

    pipe = Pipeline.from_pretrained(folder)
    try:
        if warm:
            many_short(pipe, sizes.many_short, sizes=sizes, seed=6)
        out = {"many_short": many_short(pipe, sizes.many_short, sizes=sizes)}
        if warm:
            behind_long_prefill(pipe, sizes=sizes, seed=7)
        out["behind_long_prefill"] = behind_long_prefill(pipe, sizes=sizes)
        out["slots"], out["context"] = pipe.scheduler.slots.slots, pipe.scheduler.context
        slots = pipe.scheduler.slots
        out["peak_running"] = pipe.scheduler.stats.peak_running
        out["kv_pages"], out["kv_cache_mb"] = slots.pages.pages, slots.cache_bytes() / 2**20
        out["many_short"]["requests"] = sizes.many_short
        return out
    finally:
        pipe.close()


def model_folder(name: str, checkpoints: pathlib.Path):
    if name == "real":
        from bench.real_gemma3 import gemma3_270m_gguf

        return gemma3_270m_gguf()
    from bench.checkpoints import bench_checkpoint

    return bench_checkpoint("gemma3", checkpoints, smoke=name == "smoke")


def run(name: str, n: int, checkpoints: pathlib.Path) -> dict:
    from omnijax.app.pipeline import Pipeline

    folder = model_folder(name, checkpoints)
    sizes = SIZES[name]
    pipe = Pipeline.from_pretrained(folder, max_batch=n, max_context=sizes.context, prefix_cache_mb=0,
                                    media_cache_mb=0)
    warm = name != "smoke"  # the smoke run checks the code path and the report: its figures include compiling
    if warm:
        pipe.scheduler.warm_up()
    work = workload(pipe, n, sizes=sizes)
    if warm:
        continuous(pipe, work)  # compiles what the warm-up did not (media-free, so little)
    figures = {"continuous": continuous(pipe, work), "one_at_a_time": one_at_a_time(pipe, work),
               "lockstep": lockstep(pipe, work, n), "prompts_alone": prompts_alone(pipe, work)}
    figures["short_among_long"] = short_among_long(pipe, sizes=sizes)
    pipe.close()
    cached = Pipeline.from_pretrained(folder, max_batch=n, max_context=sizes.context)
    if warm:
        chat_turns(cached, seed=3, sizes=sizes)  # compiles
    figures["chat"] = chat_turns(cached, sizes=sizes)
    cached.close()
    figures["defaults"] = at_defaults(folder, sizes, warm)
    figures["product_gflops"] = product_rates(rounds=2 if name == "smoke" else 20)
    one, prompts = figures["one_at_a_time"]["seconds"], figures["prompts_alone"]["seconds"]
    return {"model": name, "checkpoint": str(folder), "requests": n,
            "throughput_vs_one_at_a_time": figures["continuous"]["tok_s"] / figures["one_at_a_time"]["tok_s"],
            "throughput_vs_lockstep": figures["continuous"]["tok_s"] / figures["lockstep"]["tok_s"],
            "throughput_ceiling": one / prompts,
            "decode_phase_vs_one_at_a_time": (one - prompts) / max(figures["continuous"]["seconds"] - prompts, 1e-9),
            "short_request_ratio": figures["short_among_long"]["ratio"],
            "second_turn_ttft_ratio": figures["chat"]["ratio"], "figures": figures,
            "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def markdown(report: dict) -> str:
    f = report["figures"]
    rows = [f"# Serving benchmark: {report['model']} ({report['requests']} requests, {report['date']})", "",
            "| mode | tokens/s | TTFT p50 s | TTFT p99 s | seconds |", "|---|---|---|---|---|"]
    for mode in ("continuous", "lockstep", "one_at_a_time"):
        m = f[mode]
        rows.append(f"| {mode.replace('_', ' ')} | {m['tok_s']:.1f} | {m['ttft_p50_s']:.3f} | {m['ttft_p99_s']:.3f} | "
                    f"{m['seconds']:.1f} |")
    s, c = f["short_among_long"], f["chat"]
    rows += ["", "| figure | value | target |", "|---|---|---|",
             f"| continuous / one at a time (tokens/s) | {report['throughput_vs_one_at_a_time']:.2f}x | >= 3x |",
             f"| continuous / lockstep (tokens/s) | {report['throughput_vs_lockstep']:.2f}x | |",
             f"| short request among 8 long: its time / theirs | {s['ratio']:.3f} ({s['short_s']:.2f} s / "
             f"{s['long_s']:.2f} s) | < 0.25 |",
             f"| chat second turn TTFT / first turn's | {c['ratio']:.3f} ({c['second_turn_ttft_s']:.3f} s / "
             f"{c['first_turn_ttft_s']:.3f} s) | <= 0.3 |"]
    d = f["defaults"]
    m, b = d["many_short"], d["behind_long_prefill"]
    rows += ["", f"At the server's defaults ({d['slots']} slots, a {d['context']}-token context, a KV cache of "
             f"{d['kv_cache_mb']:.0f} MB with {d['kv_pages']} pages in its pool):", "",
             f"- {m['requests']} short requests at once: time to first token p50 "
             f"{m['ttft_p50_s']:.3f} s, p99 {m['ttft_p99_s']:.3f} s, all done in {m['seconds']:.1f} s, at most "
             f"{d['peak_running']} of them in the slots at once;",
             f"- a short request just after one with a {b['long_prompt_tokens']}-token prompt: its time to first "
             f"token {b['short_ttft_s']:.3f} s against the long one's {b['long_ttft_s']:.3f} s ({b['ratio']:.2f}x)."]
    a, g = f["prompts_alone"], f["product_gflops"]
    rows += ["", "What bounds the throughput ratio:", "",
             f"- the {a['prompt_tokens']} prompt tokens processed alone take {a['seconds']:.1f} s of the "
             f"{f['one_at_a_time']['seconds']:.1f} s one at a time: no batching can do better than "
             f"{report['throughput_ceiling']:.2f}x on this workload;",
             f"- after that work, the decoding of continuous batching is {report['decode_phase_vs_one_at_a_time']:.2f}x "
             f"one at a time's;",
             f"- float32 products on this machine: {g[1]:.0f} GFLOP/s at 1 row, {g[16]:.0f} at 16 rows, "
             f"{g[512]:.0f} at 512 rows ([rows, 768] x [768, 3072], XLA)."]
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bench", choices=["bench", "real", "smoke"])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--checkpoints", default=str(pathlib.Path.home() / ".cache" / "omnijax" / "bench"))
    args = p.parse_args(argv)
    report = run(args.model, args.requests, pathlib.Path(args.checkpoints))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"latest-serving-{args.model}.json").write_text(json.dumps(report, indent=2))
    (out / f"latest-serving-{args.model}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
