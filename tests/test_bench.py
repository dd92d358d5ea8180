"""The generation, load and video benchmarks' smoke runs: each module at a tiny size, one repeat. They check the code
path and the report, never the speed."""

import json

import pytest
from bench.generation import main

pytestmark = pytest.mark.slow

HEADLINES = ["decode_b1_speedup", "decode_b8_speedup", "ttft512_ratio", "decode_b1_roofline_fraction",
             "recompiles_in_bucket", "compile_s"]
MEASURES = ["ttft_128_s", "ttft_512_s", "image_encode_s", "decode_b1_tok_s", "decode_b8_tok_s"]


def test_smoke_report_has_every_field(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIJAX_TEST_TORCH", "1")  # the benchmark's transformers probes compute with torch
    out = tmp_path / "results"
    assert main(["--smoke", "--no-bf16", "--out", str(out), "--checkpoints", str(tmp_path / "ckpt")]) == 0
    reports = sorted(out.glob("generation-gemma3-*.json"))
    assert len(reports) == 1 and (out / "latest-gemma3.md").exists()
    report = json.loads(reports[0].read_text())
    for key in HEADLINES:
        assert isinstance(report[key], (int, float)), key
    for key in HEADLINES[:4]:
        assert report["ratios_of_medians"][key] > 0, key
    assert len(report["round_bandwidth_gbs"]) == report["repeats"]
    assert report["recompiles_in_bucket"] == 0
    assert report["prompt_tokens"]["image_512"] == 512 and report["prompt_tokens"]["image_128"] == 128
    for system in ("omnijax", "transformers_float32"):
        measures = report["systems"][system]["measures"]
        for key in MEASURES:
            assert measures[key]["median"] > 0, (system, key)
        assert report["systems"][system]["peak_rss_mb"] > 0
    assert report["bandwidth_gbs"]["matvec"] > 0 and report["roofline_tok_s"] > 0
    weights_only = report["weights_only"]
    assert len(weights_only["round_pass_s"]) == report["repeats"] and min(weights_only["round_pass_s"]) > 0
    assert weights_only["roofline_fraction"] > 0 and weights_only["decode_b1_fraction_of_it"] > 0
    assert 0 < weights_only["matrix_bytes"] <= report["weight_bytes"]
    scaling = report["chunk_scaling"]
    assert scaling["compile_short_context"]["compile_s"] > 0 and scaling["compile_long_context"]["compile_s"] > 0
    assert all(m["temp_bytes"] > 0 for m in scaling["chunk_temp_memory"])
    assert len(scaling["temp_growth_per_doubling"]) == len(scaling["chunk_temp_memory"]) - 1
    kv = scaling["kv_cache_32k"]
    assert kv["allocated_bytes"] <= 1.2 * kv["minimum_bytes"] < kv["full_length_cache_bytes"]  # sliding rings
    table = (out / "latest-gemma3.md").read_text()
    assert "decode_b1_speedup" in table and "omnijax" in table


def test_load_smoke_on_a_tiny_gguf(tmp_path):
    """bench.load on a tiny GGUF file (quantized to int4 as it loads) and its float32 safetensors conversion: a first
    load (the conversion into an empty weight cache) and one repeat (read back from it). (A GGUF loaded in float32
    is the real 270M's load measure in tests/test_real_gemma3.py.)"""
    from bench.load import main as load
    from fixtures.tiny_gguf import write_tiny_gemma3_gguf

    gguf = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "results"
    assert load(["--gguf", str(gguf), "--repeats", "1", "--out", str(out), "--settings", "int4"]) == 0
    report = json.loads((out / "latest-load.json").read_text())
    assert [(r["checkpoint"], r["dtype"], r["quantize"]) for r in report["runs"]] == [
        ("GGUF", "float32", "int4"), ("safetensors (from the GGUF)", "float32", None)]
    for r in report["runs"]:
        assert r["load_s"] >= r["weights_s"] > 0 and r["peak_rss_mb"] > 0 and r["weights_mb"] > 0, r
        assert r["first_load_s"] > 0 and r["first_peak_rss_mb"] > 0, r
    assert report["runs"][0]["weights_mb"] < report["runs"][1]["weights_mb"]  # int4: fewer bytes than float32
    assert "tiny.gguf" in (out / "latest-load.md").read_text()


def test_video_smoke(tmp_path):
    """bench.video on a 4-second file at 10 frames a second: each method decodes the frames its sampler picks."""
    from bench.video import main as video

    out = tmp_path / "results"
    assert video(["--seconds", "4", "--fps", "10", "--out", str(out)]) == 0
    report = json.loads((out / "latest-video.json").read_text())
    rows = {(r["method"], r["sampling"]): r for r in report["rows"]}
    assert set(rows) == {("omnijax", "2fps"), ("omnijax+resize", "2fps"), ("transformers", "2fps"),
                         ("omnijax", "32frames"), ("transformers", "32frames")}
    assert rows["omnijax", "2fps"]["frames"] == rows["transformers", "2fps"]["frames"] > 0
    assert rows["omnijax", "2fps"]["frame_shape"] == rows["transformers", "2fps"]["frame_shape"] == [720, 1280, 3]
    assert rows["omnijax+resize", "2fps"]["frame_shape"] != [720, 1280, 3]
    assert all(r["seconds"] > 0 and r["peak_rss_mb"] > 0 for r in rows.values())
