"""The front ends with a Gemma 4 model: the batch captioner captions audio files and images as the API answers
them, and the web demo offers the microphone for the model with audio (not for the one without)."""

from __future__ import annotations

import pathlib

import numpy as np
import PIL.Image

from omnijax.demo.caption import CaptionOptions, messages_for, read_rows, run_captions
from omnijax.demo.caption_items import CaptionItem, discover

MAX_NEW = 16


def test_captioner_captions_audio_and_images(tmp_path, gemma4_small_pipeline):
    import soundfile

    pipe = gemma4_small_pipeline
    folder = tmp_path / "media"
    folder.mkdir()
    t = np.arange(19000) / 16000
    soundfile.write(folder / "tone.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16000)
    PIL.Image.fromarray(np.random.default_rng(7).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(folder / "a.png")
    out = tmp_path / "captions.jsonl"
    options = CaptionOptions(max_new_tokens=MAX_NEW, batch_size=1, workers=1, progress=False)
    run_captions(pipe, discover(str(folder)), out, options, log=None)
    rows = {pathlib.Path(r["path"]).name: r for r in read_rows(out)}
    assert set(rows) == {"tone.wav", "a.png"}
    for name, row in rows.items():
        assert row["status"] == "ok", row
        item = CaptionItem(str(folder / name), "audio" if name.endswith(".wav") else "image")
        expected = pipe.generate(messages_for(item, row["prompt"]), max_new_tokens=MAX_NEW)
        assert row["caption"] == expected.text and row["new_tokens"] == len(expected.token_ids) > 0


def test_web_demo_offers_the_microphone_for_audio_models(gemma4_small_pipeline, gemma4_moe_pipeline):
    from omnijax.demo.web import build_demo

    def sources(pipe):
        config = build_demo(pipe).get_config_file()
        return next(c["props"] for c in config["components"] if c["props"].get("elem_id") == "chat-input")["sources"]

    assert gemma4_small_pipeline.config.modalities == ("image", "audio", "video")
    assert sources(gemma4_small_pipeline) == ["upload", "microphone"]
    assert sources(gemma4_moe_pipeline) == ["upload"]
