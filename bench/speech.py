"""Speech benchmark: a spoken answer from omnijax and from transformers on the same random-weight Qwen3-Omni
checkpoint (thinker, talker, code predictor, code2wav), same machine, one run.

    python -m bench.speech [--out bench/results] [--repeats 3] [--frames 100] [--smoke]

Both answer the same text prompt greedily (``talker_do_sample=False`` on the transformers side), speaking the same
thinker tokens and the same number of codec frames (a random talker seldom chooses its end code: the frames are
capped, and the codes of the two are checked equal). Measured, interleaved (omnijax, transformers, omnijax, ...)
after a warm-up: time to the first audio chunk (omnijax streams; transformers returns its audio whole, so its first
audio is its whole answer), the whole request's time, the real-time factor (request seconds per second of speech),
and peak resident memory (each system alone, in a subprocess). Writes ``speech-<time>.json`` and a markdown table,
and ``latest-speech.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from bench.generation import peak_rss_mb

PROMPT = "Tell me a long story about the sea, the wind and a small boat that sails to a faraway island."
VOICE = "chelsie"

# Qwen3-Omni-shaped with every stage at a reduced width (the published model: thinker 48 layers of 2048 with 128
# experts, talker 20 layers of 1024, code predictor 5 layers, code2wav 8 layers of 1024 and a 1536-wide vocoder):
# thinker 8 layers of 512 (16 experts, top 2), talker 6 layers of 512 (16 experts, top 4, a gated shared expert)
# reading thinker layer 4, a 3-layer code predictor, 16 code groups of 1024 codes, code2wav 4 layers of 512 and a
# 384-wide vocoder with the published upsampling (x1920: 12.5 frames per second of 24 kHz audio).
SPEECH_BENCH = {
    "thinker_config": {"text_config": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                                       "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1024,
                                       "moe_intermediate_size": 384, "num_experts": 16, "num_experts_per_tok": 2,
                                       "mlp_only_layers": [],
                                       "rope_parameters": {"interleaved": True, "mrope_interleaved": True,
                                                           "mrope_section": [24, 20, 20], "rope_theta": 1000000.0,
                                                           "rope_type": "default"}},
                       "vision_config": {"out_hidden_size": 512}, "audio_config": {"output_dim": 512}},
    "talker_config": {
        "accept_hidden_layer": 4, "thinker_hidden_size": 512, "num_code_groups": 16,
        "text_config": {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
                        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1024,
                        "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
                        "shared_expert_intermediate_size": 512, "vocab_size": 1024 + 1024,
                        "rope_parameters": {"interleaved": True, "mrope_interleaved": True,
                                            "mrope_section": [24, 20, 20], "rope_theta": 1000000.0,
                                            "rope_type": "default"}},
        "code_predictor_config": {"hidden_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8,
                                  "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1536,
                                  "vocab_size": 1024, "num_code_groups": 16},
        "codec_pad_id": 1024 + 100, "codec_bos_id": 1024 + 101, "codec_eos_token_id": 1024 + 102,
        "codec_nothink_id": 1024 + 103, "codec_think_bos_id": 1024 + 104, "codec_think_eos_id": 1024 + 105,
        "speaker_id": {"chelsie": 1024 + 200, "ethan": 1024 + 201, "aiden": 1024 + 202}},
    "code2wav_config": {"codebook_size": 1024, "num_quantizers": 16, "hidden_size": 512, "num_hidden_layers": 4,
                        "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1536,
                        "sliding_window": 72, "decoder_dim": 384, "upsample_rates": [8, 5, 4, 3],
                        "upsampling_ratios": [2, 2]},
}
SPEECH_SMOKE: dict = {}  # the tests' tiny checkpoint as it is


def merged(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def bench_checkpoint(root: pathlib.Path, smoke: bool) -> pathlib.Path:
    """The benchmark's full Qwen3-Omni folder under ``root`` (built on first use, like bench/checkpoints.py)."""
    from fixtures.qwen3_omni_checkpoint import TINY_QWEN3_OMNI_CONFIG, build_tiny_full_model

    overrides = SPEECH_SMOKE if smoke else SPEECH_BENCH
    folder = root / f"qwen3-omni-speech-{'smoke' if smoke else 'bench'}"
    marker = folder / ".bench-config.json"
    if marker.exists() and json.loads(marker.read_text()) == overrides:
        return folder
    build_tiny_full_model(folder, seed=0, config=merged(TINY_QWEN3_OMNI_CONFIG, overrides))
    marker.write_text(json.dumps(overrides))
    return folder


MESSAGES = [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]


class Omnijax:
    name = "omnijax"

    def __init__(self, folder):
        from omnijax.app.pipeline import Pipeline

        self.pipe = Pipeline.from_pretrained(folder)

    def speak(self, tokens: int, frames: int) -> dict:
        from omnijax.app.speech_events import AudioChunk

        start = time.perf_counter()
        events = self.pipe.stream(MESSAGES, max_new_tokens=tokens, speak=True, voice=VOICE, max_speech_frames=frames)
        first = None
        while True:
            try:
                event = next(events)
            except StopIteration as stop:
                result = stop.value
                break
            if isinstance(event, AudioChunk) and first is None:
                first = time.perf_counter() - start
        total = time.perf_counter() - start
        return {"first_audio_s": first, "total_s": total, "audio_s": len(result.audio) / result.sample_rate,
                "tokens": result.token_ids, "codes": result.audio_codes}


class Transformers:
    name = "transformers"

    def __init__(self, folder):
        import fixtures.qwen3_omni_checkpoint as qc
        from fixtures.qwen3_omni_speech_reference import load_full_model

        from omnijax.app.families.qwen3_omni.spec import parse_config

        self.model = load_full_model(folder)
        self.processor = qc.load_processor(folder)
        self.eos_ids = parse_config(json.loads((pathlib.Path(folder) / "config.json").read_text())).eos_ids
        gen = json.loads((pathlib.Path(folder) / "generation_config.json").read_text())
        self.eos_ids = tuple(gen.get("eos_token_id") or self.eos_ids)

    def speak(self, tokens: int, frames: int) -> dict:
        from fixtures.qwen3_omni_speech_reference import reference_speech

        start = time.perf_counter()
        ref = reference_speech(self.model, self.processor, MESSAGES, speaker=VOICE, max_new_tokens=tokens,
                               max_frames=frames, eos_ids=self.eos_ids)
        total = time.perf_counter() - start
        # transformers returns the audio whole: its first audio comes with its last
        return {"first_audio_s": total, "total_s": total, "audio_s": len(ref.audio) / 24000, "tokens": ref.tokens,
                "codes": ref.codes}


SYSTEMS = {"omnijax": Omnijax, "transformers": Transformers}


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def memory_probe(system: str, folder: str, tokens: int, frames: int) -> None:
    """Run in a subprocess: load one system, speak once, print peak RSS in MB."""
    SYSTEMS[system](folder).speak(tokens, frames)
    print(json.dumps({"peak_rss_mb": peak_rss_mb()}))


def peak_memory(system: str, folder, tokens: int, frames: int) -> float | None:
    proc = subprocess.run([sys.executable, "-m", "bench.speech", "--memory-probe", system, "--checkpoint", str(folder),
                           "--tokens", str(tokens), "--frames", str(frames)], capture_output=True, text=True,
                          timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])["peak_rss_mb"] if proc.returncode == 0 and lines else None


def run(out_dir: pathlib.Path, repeats: int, tokens: int, frames: int, smoke: bool, ckpt_root: pathlib.Path,
        memory: bool) -> dict:
    folder = bench_checkpoint(ckpt_root, smoke)
    systems = {name: cls(folder) for name, cls in SYSTEMS.items()}
    start = time.perf_counter()
    first = systems["omnijax"].speak(tokens, frames)  # compiles
    compile_first_call_s = time.perf_counter() - start
    reference = systems["transformers"].speak(tokens, frames)  # warms transformers up
    spoken = len(first["tokens"]) - (first["tokens"][-1] in systems["omnijax"].pipe.config.eos_ids)
    same = (first["tokens"] == reference["tokens"][:len(first["tokens"])]
            and np.array_equal(first["codes"], reference["codes"]))
    if not same:
        raise RuntimeError("omnijax and transformers did not speak the same tokens and codes: the timings would "
                           "compare different work")
    rounds: dict[str, list[dict]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, system in systems.items():  # interleaved
            m = system.speak(tokens, frames)
            rounds[name].append({k: m[k] for k in ("first_audio_s", "total_s", "audio_s")})
    report_systems = {}
    for name in systems:
        rs = rounds[name]
        report_systems[name] = {
            "first_audio_s": summary([r["first_audio_s"] for r in rs]),
            "total_s": summary([r["total_s"] for r in rs]),
            "real_time_factor": summary([r["total_s"] / r["audio_s"] for r in rs]),
            "peak_rss_mb": peak_memory(name, folder, tokens, frames) if memory else None,
        }
    per_round_rtf = [t["total_s"] / o["total_s"] for o, t in zip(rounds["omnijax"], rounds["transformers"])]
    per_round_first = [o["first_audio_s"] / t["total_s"] for o, t in zip(rounds["omnijax"], rounds["transformers"])]
    pipe = systems["omnijax"].pipe
    import jax

    report = {
        "benchmark": "speech", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": smoke,
        "device": f"{jax.devices()[0].platform}, {platform.processor() or platform.machine()}",
        "checkpoint": str(folder), "repeats": repeats, "thinker_tokens": len(first["tokens"]),
        "spoken_tokens": spoken, "frames": int(len(first["codes"])), "code_groups": int(first["codes"].shape[1]),
        "audio_s": first["audio_s"], "codes_equal": same,
        "params_millions": {part: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(sub)) / 1e6
                            for part, sub in (("thinker", pipe.engine.params["decoder"]),
                                              ("talker", pipe.engine.params["speech"]["talker"]),
                                              ("code2wav", pipe.engine.params["speech"]["code2wav"]))},
        "omnijax_first_call_s": compile_first_call_s,
        "systems": report_systems,
        # headline ratios, each per round (the machine is shared: ratios from one round are the fair comparison)
        "rtf_speedup": summary(per_round_rtf),
        "first_audio_fraction_of_transformers_total": summary(per_round_first),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out_dir / f"speech-{stamp}.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out_dir / f"speech-{stamp}.md").write_text(table)
    (out_dir / "latest-speech.md").write_text(table)
    return report


def markdown(r: dict) -> str:
    rows = ["| measure | omnijax | transformers |", "|---|---|---|"]
    for key in ("first_audio_s", "total_s", "real_time_factor"):
        cells = [f"{r['systems'][s][key]['median']:.3g} ({r['systems'][s][key]['min']:.3g}-"
                 f"{r['systems'][s][key]['max']:.3g})" for s in ("omnijax", "transformers")]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    mem = [r["systems"][s]["peak_rss_mb"] for s in ("omnijax", "transformers")]
    rows.append("| peak_rss_mb | " + " | ".join("n/a" if m is None else f"{m:.0f}" for m in mem) + " |")
    params = ", ".join(f"{k} {v:.1f}M" for k, v in r["params_millions"].items())
    return "\n".join([
        f"# Speech benchmark ({r['device']}, {r['date']})", "",
        f"Random-weight Qwen3-Omni checkpoint ({params} parameters, float32); one text prompt answered greedily: "
        f"{r['spoken_tokens']} spoken tokens, {r['frames']} codec frames of {r['code_groups']} codes = "
        f"{r['audio_s']:.2f} s of 24 kHz speech (the codes of the two systems equal: {r['codes_equal']}). Medians "
        f"(min-max) of {r['repeats']} interleaved rounds; transformers returns its audio whole, so its first "
        f"audio is its whole answer.", "", *rows, "",
        f"- real-time factor, transformers / omnijax per round: median {r['rtf_speedup']['median']:.2f}x "
        f"(min {r['rtf_speedup']['min']:.2f}x)",
        f"- omnijax's first audio as a fraction of transformers' whole answer per round: median "
        f"{r['first_audio_fraction_of_transformers_total']['median']:.3f} "
        f"(max {r['first_audio_fraction_of_transformers_total']['max']:.3f})",
        f"- omnijax's first call (compiling): {r['omnijax_first_call_s']:.1f} s", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.speech", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32, help="thinker tokens (the answer spoken)")
    p.add_argument("--frames", type=int, default=100, help="codec frames spoken (12.5 per second)")
    p.add_argument("--smoke", action="store_true", help="the tests' tiny checkpoint: checks the code path only")
    p.add_argument("--checkpoints", default=None, help="where benchmark checkpoints are built (default "
                                                       "$OMNIJAX_HOME/bench)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--memory-probe", choices=sorted(SYSTEMS), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_probe:
        memory_probe(args.memory_probe, args.checkpoint, args.tokens, args.frames)
        return 0
    from omnijax.common.paths import omnijax_home

    root = pathlib.Path(args.checkpoints) if args.checkpoints else omnijax_home() / "bench"
    report = run(pathlib.Path(args.out), args.repeats, args.tokens, args.frames, args.smoke, root,
                 not args.no_memory)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
