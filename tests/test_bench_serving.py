"""The serving, speech, real-decode and structured-output benchmarks' smoke runs: each module at a tiny size, one
round. They check the code path and the report, never the speed."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_real_decode_smoke_on_a_tiny_gguf(tmp_path):
    """bench.real_decode's code path (a system in its own process) on a tiny GGUF file, llama.cpp left out."""
    from bench.real_decode import main as real_decode
    from fixtures.tiny_gguf import write_tiny_gemma3_gguf

    gguf = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "results"
    systems = ["omnijax-int8"]
    assert real_decode(["--smoke", "--gguf", str(gguf), "--systems", ",".join(systems), "--out", str(out)]) == 0
    report = json.loads((out / "latest-real-decode.json").read_text())
    assert list(report["systems"]) == systems and report["new_tokens"] == 4 and report["rounds"] == 1
    for name in systems:
        entry = report["systems"][name]
        assert entry["decode_tok_s"]["median"] > 0 and entry["load_s"]["median"] > 0, name
        assert entry["peak_rss_mb"]["max"] >= entry["load_peak_rss_mb"]["max"] > 0 and entry["decoder_weight_mb"] > 0, name
        assert len(entry["tokens"]) == 4, name
    assert report["ratios"] == {} and "llama.cpp was not run" in (out / "latest-real-decode.md").read_text()
    # the CPU the figures were measured on, and the instruction set omnijax's CPU kernels took there
    from omnijax.common.cpu import cpu_flags
    from omnijax.common.kernels import native_library

    assert all(f in report["cpu"] for f in ("avx2", "avx512f") if f in cpu_flags())
    assert report["kernels"] == native_library.best_isa() is not None
    assert real_decode(["--smoke", "--systems", "omnijax-int9"]) == 2


def test_structured_smoke(tmp_path, tiny_gemma3_dir):
    """bench.structured on the tiny Gemma 3: both answers timed, the constrained one following the schema, the large
    schema compiled."""
    from bench.structured import SCHEMA, main as structured

    out = tmp_path / "results"
    assert structured(["--smoke", "--model", str(tiny_gemma3_dir), "--out", str(out)]) == 0
    report = json.loads((out / "latest-structured-smoke.json").read_text())
    assert report["rounds"] == 1 and report["new_tokens"] == 8 and report["schema"] == SCHEMA
    assert report["unconstrained_tok_s"]["median"] > 0 and report["constrained_tok_s"]["median"] > 0
    assert report["tokens"] == [[8, 8]] and report["constrained_finish_reasons"] == ["length"]
    assert report["constrained_answer"].startswith('{"park":')  # the schema's first property
    assert report["constrained_per_token_ratio"] == report["round_ratios"][0] > 0
    assert report["grammar_compile_s"]["median"] > 0 and report["large_schema_fields"] == 30
    assert "JSON schema" in (out / "latest-structured-smoke.md").read_text()
    assert structured(["--new-tokens", "2"]) == 2


def test_serving_smoke(tmp_path):
    """bench.serving on the few-MB model at a few tokens a request: every figure of the report is there."""
    from bench.serving import main as serving

    out = tmp_path / "results"
    assert serving(["--model", "smoke", "--requests", "2", "--out", str(out),
                    "--checkpoints", str(tmp_path / "ckpt")]) == 0
    report = json.loads((out / "latest-serving-smoke.json").read_text())
    for key in ("throughput_vs_one_at_a_time", "throughput_vs_lockstep", "throughput_ceiling",
                "short_request_ratio", "second_turn_ttft_ratio"):
        assert report[key] > 0, key
    figures = report["figures"]
    assert figures["continuous"]["tokens"] == figures["one_at_a_time"]["tokens"] == figures["lockstep"]["tokens"]
    assert set(figures["product_gflops"]) == {"1", "16", "512"}  # JSON keys
    defaults = figures["defaults"]
    assert defaults["many_short"]["tokens"] == 4 * 2  # the smoke's short requests, 2 tokens each
    behind = defaults["behind_long_prefill"]
    assert behind["long_prompt_tokens"] > 200 and behind["short_ttft_s"] > 0 and behind["long_ttft_s"] > 0
    assert "continuous / one at a time" in (out / "latest-serving-smoke.md").read_text()


def test_speech_smoke(tmp_path):
    """bench.speech on the tests' tiny Qwen3-Omni: omnijax and transformers speak the same codes (the benchmark
    refuses to time different work), one round, a few tokens and frames."""
    from bench.speech import main as speech

    out = tmp_path / "results"
    assert speech(["--smoke", "--repeats", "1", "--tokens", "4", "--frames", "4", "--no-memory", "--out", str(out),
                   "--checkpoints", str(tmp_path / "ckpt")]) == 0
    report = json.loads(next(out.glob("speech-*.json")).read_text())
    assert report["codes_equal"] is True and report["frames"] == 4 and report["repeats"] == 1
    for system in ("omnijax", "transformers"):
        assert report["systems"][system]["total_s"]["median"] > 0, system
    assert report["rtf_speedup"]["median"] > 0
    assert "real-time factor" in (out / "latest-speech.md").read_text()
