"""Structured-output benchmark: batch-1 decode tokens/s of one model with and without a JSON schema, and the time
to compile a large schema.

    python -m bench.structured [--model bench|real|PATH] [--new-tokens 128] [--rounds 5] [--out bench/results]
                               [--smoke]

``--model bench`` (the default) is the generation benchmark's Gemma 3 checkpoint (bench/checkpoints.py, random
weights); ``real`` is the real Gemma 3 270M (the Q4_K_M GGUF of the test extra, float32 weights); a path is any
checkpoint folder or GGUF file. In one process, with one slot: a raw prompt answered greedily ``--new-tokens``
tokens long, unconstrained (end ids ignored) and constrained by ``SCHEMA`` (a JSON object holding a long array of
small objects: its answer is still open after ``--new-tokens`` tokens, so both run as long), the two taking turns
in each round after one warm-up run each (which compiles the programs, the constrained sample program's masked
variant included). Decode time per token = (last arrival - first arrival) / (tokens - 1) from the stream's events;
the headline is the median over rounds of the constrained / unconstrained ratio within a round (target: under
1.10, i.e. under 10% slower per token). Grammar compile: ``large_schema`` (``--fields`` properties of every common
kind: bounded strings, patterns, enums, bounded numbers, arrays with item bounds, anyOf, nested objects) compiled
for the model's vocabulary (llguidance), each round a variant of it (another description, so nothing is reused),
and the first token mask of a fresh answer to it; the tokenizer's one-time wrapping for llguidance is reported
apart. Writes ``structured-<model>-<time>.json`` and ``latest-structured-<model>.md`` / ``.json`` into ``--out``.
``--smoke`` (the tests' run): the smoke checkpoint, one round, a few tokens; it checks the code path and the
report, never the speed. The report names the CPU and its vector-instruction flags.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from bench.real_decode import cpu_description

PROMPT = "A list of the animals seen in the park today, as JSON:"
CONTEXT = 512  # the slot's context: the prompt and --new-tokens fit
SCHEMA = {"type": "object",
          "properties": {"park": {"type": "string", "maxLength": 40},
                         "animals": {"type": "array", "minItems": 200,
                                     "items": {"type": "object",
                                               "properties": {"name": {"type": "string", "maxLength": 24},
                                                              "count": {"type": "integer", "minimum": 0}},
                                               "required": ["name", "count"], "additionalProperties": False}}},
          "required": ["park", "animals"], "additionalProperties": False}


def large_schema(fields: int, variant: int = 0) -> dict:
    """A JSON schema of ``fields`` properties cycling through the common kinds (``variant`` changes a description
    only: the same size, another grammar to compile)."""
    kinds = [{"type": "string", "maxLength": 64},
             {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
             {"enum": ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]},
             {"type": "integer", "minimum": -1000, "maximum": 1000},
             {"type": "number", "minimum": 0},
             {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 8},
             {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "integer"}, {"type": "null"}]},
             {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {
                 "enum": ["a", "b", "c"]}}, "note": {"type": "string"}}, "required": ["id"],
              "additionalProperties": False},
             {"type": "boolean"}]
    properties = {f"field_{i:03d}": kinds[i % len(kinds)] for i in range(fields)}
    return {"type": "object", "description": f"variant {variant}", "properties": properties,
            "required": [name for i, name in enumerate(properties) if i % 3 == 0], "additionalProperties": False}


def per_token_s(pipe, prompt, new_tokens: int, response_format: dict | None) -> tuple[float, int, str, str]:
    """(seconds per decoded token after the first, tokens, finish reason, text) of one greedy answer."""
    times = []
    handle = pipe.submit(prompt, max_new_tokens=new_tokens, ignore_eos=True, response_format=response_format)
    for event in handle.events():
        if event.token_id is not None:
            times.append(time.perf_counter())
    result = handle.result()
    if len(times) < 3:
        raise SystemExit(f"python -m bench.structured: an answer of {len(times)} tokens cannot be timed")
    return (times[-1] - times[0]) / (len(times) - 1), len(times), result.finish_reason, result.text


def grammar_compile(pipe, fields: int, variant: int) -> dict:
    """Seconds to compile ``large_schema(fields, variant)`` for the model and to compute a fresh answer's first
    token mask."""
    constraint_format = {"type": "json_schema", "json_schema": {"name": "large",
                                                                "schema": large_schema(fields, variant)}}
    start = time.perf_counter()
    constraint = pipe.check_response_format(constraint_format)
    compiled = time.perf_counter()
    grammars = pipe.scheduler.grammars
    grammars.masks([grammars.matcher(constraint)])
    return {"compile_s": compiled - start, "first_mask_s": time.perf_counter() - compiled}


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def load(model: str, smoke: bool):
    """(the pipeline, the checkpoint's path) for ``--model``."""
    from omnijax.app.pipeline import Pipeline

    if model == "bench":
        from bench.checkpoints import bench_checkpoint

        path = bench_checkpoint("gemma3", pathlib.Path.home() / ".cache" / "omnijax" / "bench", smoke=smoke)
    elif model == "real":
        from bench.real_gemma3 import gemma3_270m_gguf

        path = gemma3_270m_gguf()
    else:
        path = pathlib.Path(model)
    return Pipeline.from_pretrained(path, dtype="float32", max_batch=1, max_context=CONTEXT), path


def run(model: str, out: pathlib.Path, rounds: int, new_tokens: int, fields: int, smoke: bool) -> dict:
    pipe, path = load(model, smoke)
    try:
        prompt = pipe.prepare_raw(PROMPT)
        constrained = {"type": "json_schema", "json_schema": {"name": "animals", "schema": SCHEMA}}
        start = time.perf_counter()
        pipe.scheduler.grammars.tokenizer  # noqa: B018 (wrapped for llguidance once per model: timed apart)
        wrap_s = time.perf_counter() - start
        for fmt in (None, constrained):  # warm-up: compiles what each needs
            per_token_s(pipe, prompt, new_tokens, fmt)
        plain, bound, ratios, tokens, reasons = [], [], [], [], []
        for _ in range(rounds):
            p, n_plain, _, _ = per_token_s(pipe, prompt, new_tokens, None)
            c, n_bound, reason, text = per_token_s(pipe, prompt, new_tokens, constrained)
            plain.append(p)
            bound.append(c)
            ratios.append(c / p)
            tokens.append((n_plain, n_bound))
            reasons.append(reason)
        compiles = [grammar_compile(pipe, fields, variant) for variant in range(rounds)]
    finally:
        pipe.close()
    report = {
        "model": model, "checkpoint": str(path), "cpu": cpu_description(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "smoke": smoke, "rounds": rounds, "new_tokens": new_tokens, "prompt": PROMPT, "schema": SCHEMA,
        "unconstrained_tok_s": summary([1 / s for s in plain]), "constrained_tok_s": summary([1 / s for s in bound]),
        "constrained_per_token_ratio": statistics.median(ratios), "round_ratios": ratios,
        "tokens": tokens, "constrained_finish_reasons": reasons, "constrained_answer": text,
        "tokenizer_wrap_s": wrap_s, "large_schema_fields": fields,
        "large_schema_bytes": len(json.dumps(large_schema(fields))),
        "grammar_compile_s": summary([c["compile_s"] for c in compiles]),
        "grammar_first_mask_s": summary([c["first_mask_s"] for c in compiles]),
    }
    out.mkdir(parents=True, exist_ok=True)
    name = "smoke" if smoke else model if model in ("bench", "real") else pathlib.Path(model).stem
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"structured-{name}-{stamp}.json").write_text(json.dumps(report, indent=2))
    (out / f"latest-structured-{name}.json").write_text(json.dumps(report, indent=2))
    (out / f"latest-structured-{name}.md").write_text(markdown(report))
    return report


def markdown(r: dict) -> str:
    fmt = lambda s: f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"  # noqa: E731
    ms = lambda s: f"{1000 * s['median']:.2f} ({1000 * s['min']:.2f}-{1000 * s['max']:.2f})"  # noqa: E731
    return "\n".join([
        f"# Structured outputs: {r['model']} ({r['date']})", "",
        f"CPU: {r['cpu']}. Batch-1 greedy decode of {r['new_tokens']} tokens from a raw prompt, float32 weights; "
        f"{r['rounds']} rounds, median (min-max); the ratio is the median of the ratios within each round.", "",
        "| | decode tok/s |", "|---|---|",
        f"| unconstrained | {fmt(r['unconstrained_tok_s'])} |",
        f"| JSON schema | {fmt(r['constrained_tok_s'])} |", "",
        f"Time per token constrained / unconstrained: **{r['constrained_per_token_ratio']:.3f}** (target: under "
        f"1.10). Constrained answers ended by: {', '.join(sorted(set(r['constrained_finish_reasons'])))}; the last "
        f"one: `{r['constrained_answer'][:160]}`", "",
        f"A schema of {r['large_schema_fields']} properties ({r['large_schema_bytes']:,} bytes of JSON): compiled in "
        f"{ms(r['grammar_compile_s'])} ms, its first token mask {ms(r['grammar_first_mask_s'])} ms; wrapping the "
        f"tokenizer for llguidance (once per model) {1000 * r['tokenizer_wrap_s']:.0f} ms.", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bench", help="bench (default), real, or a checkpoint folder / GGUF file")
    p.add_argument("--out", default="bench/results", help="folder for the JSON report and markdown table")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--fields", type=int, default=300, help="properties of the large schema")
    p.add_argument("--smoke", action="store_true", help="tiny model, one round, a few tokens: checks the report")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.new_tokens < 4 or args.new_tokens > CONTEXT // 2 or args.fields < 1:
        print(f"python -m bench.structured: --rounds must be at least 1, --new-tokens 4..{CONTEXT // 2} and "
              f"--fields at least 1", file=sys.stderr)
        return 2
    rounds, new_tokens, fields = (1, 8, 30) if args.smoke else (args.rounds, args.new_tokens, args.fields)
    report = run(args.model, pathlib.Path(args.out), rounds, new_tokens, fields, args.smoke)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
