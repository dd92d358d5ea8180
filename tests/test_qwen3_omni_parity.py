"""Qwen3-Omni thinker end to end against transformers (float32): processor outputs, MRoPE positions, logits,
greedy tokens, batching, full-model checkpoints and bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from omnijax.common.errors import MediaError, PromptError
from omnijax.app.pipeline import Pipeline

pytestmark = pytest.mark.reference

SR = 16000


def image(seed: int, size=(64, 48)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def clip(seed: int, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    noise = 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    return (0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + noise).astype(np.float32)


def user(*parts, system=None):
    content = []
    for p in parts:
        if isinstance(p, Image.Image):
            content.append({"type": "image", "image": p})
        elif isinstance(p, np.ndarray):
            content.append({"type": "audio", "audio": p})
        else:
            content.append({"type": "text", "text": p})
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": content}]


CASES = {
    "text": user("Tell me about the sea."),
    "image": user(image(1), "What is in the picture?"),
    "audio": user(clip(1, 1.7), "What do you hear?"),
    "image_audio": user(image(2, (40, 56)), clip(2, 0.5), "Answer the spoken question about this image.",
                        system="You are a helpful assistant."),
    "two_images": user(image(3), "and", image(4, (32, 32)), "compare them."),
    "two_clips": user(clip(3, 1.2), clip(4, 2.3), "Which one is louder?"),
    # 4.5 s = 450 feature frames: with n_window_infer 200 the audio tower attends in three separate windows
    "long_audio": user(clip(6, 4.5), "Summarise."),
}


def hf_inputs(processor, messages):
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")


@pytest.mark.parametrize("case", list(CASES))
def test_processor_and_positions_parity(qwen_pipeline, hf_qwen_processor, hf_qwen_thinker, case):
    ours = qwen_pipeline.prepare(CASES[case])
    ref = hf_inputs(hf_qwen_processor, CASES[case])
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0].numpy())
    if "pixel_values" in ref:
        patches = np.concatenate([it["patches"] for it in ours.media["image"]])
        assert np.abs(patches - ref["pixel_values"].numpy()).max() <= 1e-5
        assert [it["grid"] for it in ours.media["image"]] == [tuple(g) for g in ref["image_grid_thw"].tolist()]
    else:
        assert "image" not in ours.media
    if "input_features" in ref:
        mask = ref["feature_attention_mask"].numpy().astype(bool)
        feats = ref["input_features"].numpy()
        assert len(ours.media["audio"]) == len(mask)
        for item, f, m in zip(ours.media["audio"], feats, mask):
            assert item["features"].shape == f[:, m].shape
            assert np.abs(item["features"] - f[:, m]).max() <= 1e-4
    else:
        assert "audio" not in ours.media
    positions, deltas = hf_qwen_thinker.get_rope_index(
        ref["input_ids"], image_grid_thw=ref.get("image_grid_thw"), attention_mask=ref["attention_mask"],
        audio_seqlens=ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None)
    np.testing.assert_array_equal(ours.rope_positions, positions[:, 0].numpy().astype(np.int64))
    assert ours.rope_delta == int(deltas[0, 0])


@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity(qwen_pipeline, hf_qwen_processor, hf_qwen_thinker, case):
    inputs = hf_inputs(hf_qwen_processor, CASES[case])
    with torch.no_grad():
        ref = hf_qwen_thinker(**inputs).logits[0].numpy()
    ours = qwen_pipeline.prompt_logits(CASES[case])
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


def test_tiny_config_exercises_windows_deepstack_and_both_mlp_kinds(qwen_pipeline):
    cfg = qwen_pipeline.config
    assert cfg.decoder.deepstack_layers >= 2
    assert {"moe", "dense"} <= {layer.ffn.kind for layer in cfg.decoder.layers}
    audio = cfg.encoder_config("audio")
    frames = qwen_pipeline.prepare(user(clip(5, 12.0), "Hi"))
    n_frames = frames.media["audio"][0]["features"].shape[1]
    assert n_frames // 100 >= audio.n_window_infer // 100 + 1  # a 12 s clip spans several attention windows


@pytest.mark.parametrize("case", ["text", "image", "audio", "image_audio"])
def test_greedy_generation_equals_transformers(qwen_pipeline, hf_qwen_processor, hf_qwen_thinker, case):
    inputs = hf_inputs(hf_qwen_processor, CASES[case])
    with torch.no_grad():
        ref = hf_qwen_thinker.generate(**inputs, max_new_tokens=18, do_sample=False)
    ref_new = ref[0, inputs["input_ids"].shape[1]:].tolist()
    ours = qwen_pipeline.generate(CASES[case], max_new_tokens=18)
    assert len(ref_new) >= 16
    assert ours.token_ids == ref_new


def test_mixed_batch_equals_each_alone(qwen_pipeline):
    convs = [CASES["audio"], CASES["text"], CASES["image_audio"]]
    batch = qwen_pipeline.generate(convs, max_new_tokens=10)
    alone = [qwen_pipeline.generate(c, max_new_tokens=10) for c in convs]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]


def test_full_checkpoint_loads_thinker_talker_and_code2wav(qwen_speech_pipeline, qwen_pipeline):
    """A full checkpoint with audio output loads every tensor (none skipped) and its thinker answers as the
    thinker-only folder's (its speech: test_qwen3_omni_speech.py; with audio output off: the talker is skipped)."""
    assert qwen_speech_pipeline.has_talker
    msg = CASES["image_audio"]
    assert qwen_speech_pipeline.generate(msg, max_new_tokens=8).token_ids == \
        qwen_pipeline.generate(msg, max_new_tokens=8).token_ids


def test_bad_audio_inputs(qwen_pipeline, tmp_path):
    corrupt = tmp_path / "q.wav"
    corrupt.write_bytes(b"RIFF....WAVEfmt garbage" * 4)
    with pytest.raises(MediaError, match="q.wav"):
        qwen_pipeline.generate(user(np.zeros(0, np.float32), "Hi") if False else
                               [{"role": "user", "content": [{"type": "audio", "audio": str(corrupt)}]}])
    with pytest.raises(MediaError, match="empty|no samples|0 samples"):
        qwen_pipeline.generate(user(np.zeros(0, np.float32), "Hi"))


def test_audio_longer_than_the_limit(tiny_qwen_dir):
    pipe = Pipeline.from_pretrained(tiny_qwen_dir, max_audio_seconds=2.0)
    with pytest.raises(MediaError, match="2.5.*2"):
        pipe.generate(user(clip(1, 2.5), "Hi"))
    assert pipe.generate(user(clip(1, 1.5), "Hi"), max_new_tokens=2).token_ids


def test_audio_over_the_context_is_refused_from_its_header(qwen_pipeline, tmp_path, monkeypatch):
    """A clip whose tokens alone cannot fit the context (its length from the file's header, 13 tokens a second):
    refused before it is decoded, whatever its rate and channels; a clip that fits still loads."""
    import soundfile

    from omnijax.preprocess.qwen3_omni import processor as qwen_processor

    context = qwen_pipeline.processor.budget.max_tokens
    seconds = context / 13 + 10
    path = tmp_path / "long.wav"
    with soundfile.SoundFile(str(path), "w", samplerate=8000, channels=2, subtype="PCM_16") as f:
        f.write(np.zeros((int(seconds * 8000), 2), np.int16))
    monkeypatch.setattr(qwen_processor, "load_audio", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(PromptError, match=f"takes at least .* tokens; the context budget is {context} tokens"):
        qwen_pipeline.prepare([{"role": "user", "content": [{"type": "audio", "audio": str(path)},
                                                             {"type": "text", "text": "Hi"}]}])
    monkeypatch.undo()
    assert qwen_pipeline.processor.fewest_audio_tokens(1.0) <= len(
        np.flatnonzero(qwen_pipeline.prepare(user(clip(1, 1.0), "Hi")).token_ids
                       == qwen_pipeline.config.media_token_id("audio")))


def test_typed_placeholders_are_plain_text(qwen_pipeline):
    """A placeholder typed in the text is text: only the template's own placeholders take media."""
    image_id, audio_id = (qwen_pipeline.config.media_token_id(m) for m in ("image", "audio"))
    with_image = qwen_pipeline.prepare(user(image(1), "what about <|image_pad|> this?"))
    alone = qwen_pipeline.prepare(user(image(1), "what about this?"))
    assert (with_image.token_ids == image_id).sum() == (alone.token_ids == image_id).sum() > 0
    typed = qwen_pipeline.prepare(user("hear <|audio_pad|>"))
    assert (typed.token_ids == audio_id).sum() == 0 and "audio" not in typed.media
    assert qwen_pipeline.processor.decode(typed.token_ids).count("<|audio_pad|>") == 1


def test_cli_with_audio_and_image_matches_the_api(tiny_qwen_dir, qwen_pipeline, tmp_path, capsys):
    import soundfile

    from omnijax.app.cli import main

    wav, png = tmp_path / "q.wav", tmp_path / "chart.png"
    soundfile.write(wav, clip(7, 1.0), SR)
    image(8).save(png)
    code = main(["generate", "--model", str(tiny_qwen_dir), "--audio", str(wav), "--image", str(png),
                 "--prompt", "Answer the question.", "--max-new-tokens", "8", "--no-stream"])
    assert code == 0
    expected = qwen_pipeline.generate([{"role": "user", "content": [
        {"type": "image", "image": str(png)}, {"type": "audio", "audio": str(wav)},
        {"type": "text", "text": "Answer the question."}]}], max_new_tokens=8)
    assert capsys.readouterr().out == expected.text + "\n"
