"""Shape scenes, their question/answer templates and the default model's tokenizer (app/shape_*.py)."""

from __future__ import annotations

import collections
import io
import itertools

import numpy as np
import PIL.Image
import pytest

from training import dialogues as sd
from training.scenes import (BACKGROUNDS, COLOURS, KINDS, MAX_SHAPE, MIN_SHAPE, Scene, Shape, encode, render,
                              render_file_like, sample_scene, scene_from_dict, shape_map)
from training.tokenizer import build_shape_tokenizer, corpus, shape_vocab, special_token_ids


def _scenes(n: int, seed: int = 0) -> list[Scene]:
    rng = np.random.default_rng(seed)
    return [sample_scene(rng) for _ in range(n)]


def _scene(background: str, *shapes: tuple[str, str]) -> Scene:
    """A scene for template tests: shapes (kind, colour) side by side."""
    return Scene(400, 200, background, BACKGROUNDS[background],
                 tuple(Shape(k, c, 10 + 120 * i, 20, 60, COLOURS[c]) for i, (k, c) in enumerate(shapes)))


# ------------------------------------------------------------------------------------------------ scenes


def test_scenes_are_deterministic_per_seed():
    a, b, c = _scenes(20, seed=1), _scenes(20, seed=1), _scenes(20, seed=2)
    assert a == b and a != c
    assert np.array_equal(np.asarray(render(a[3])), np.asarray(render(b[3])))


def test_scenes_keep_to_the_specification():
    scenes = _scenes(600)
    seen = collections.Counter()
    for s in scenes:
        assert 64 <= s.width <= 1024 and 64 <= s.height <= 1024
        assert 0.5 <= s.height / s.width <= 2.0
        assert 1 <= len(s.shapes) <= 3 and s.background in BACKGROUNDS
        short = min(s.width, s.height)
        for shape in s.shapes:
            assert shape.kind in KINDS and shape.colour in COLOURS
            assert MIN_SHAPE * short - 1 <= shape.size <= MAX_SHAPE * short + 1
            assert 0 <= shape.left and shape.left + shape.size <= s.width
            assert 0 <= shape.top and shape.top + shape.size <= s.height
            seen[shape.kind] += 1
            seen[shape.colour] += 1
        for p, q in itertools.combinations(s.shapes, 2):  # bounding boxes never overlap
            assert (p.left + p.size <= q.left or q.left + q.size <= p.left or p.top + p.size <= q.top
                    or q.top + q.size <= p.top)
        seen[len(s.shapes)] += 1
        seen[s.background] += 1
    assert all(seen[k] > 0 for k in (*KINDS, *COLOURS, *BACKGROUNDS, 1, 2, 3))
    widths = [s.width for s in scenes]
    assert min(widths) < 100 and max(widths) > 800


def test_background_colours_are_far_from_shape_colours():
    for bg, shape in itertools.product(BACKGROUNDS.values(), COLOURS.values()):
        assert np.linalg.norm(np.subtract(bg, shape, dtype=float)) > 90, (bg, shape)


def test_render_paints_each_shape_and_leaves_the_background():
    for s in _scenes(60, seed=3):
        pixels = np.asarray(render(s)).astype(int)
        assert pixels.shape == (s.height, s.width, 3)
        for shape in s.shapes:
            cx, low = shape.left + shape.size // 2, shape.top + (3 * shape.size) // 4
            assert tuple(pixels[low, cx]) == shape.rgb  # inside every kind of shape
            corner = tuple(pixels[shape.top + 1, shape.left + 1])
            expected = shape.rgb if shape.kind == "square" else s.background_rgb  # circles and triangles miss it
            assert corner == expected, (shape, corner)


def test_jpeg_round_trip_and_file_like_rendering():
    scene = _scenes(1, seed=4)[0]
    png = PIL.Image.open(io.BytesIO(encode(render(scene), "PNG")))
    assert np.array_equal(np.asarray(png), np.asarray(render(scene)))
    jpeg = np.asarray(PIL.Image.open(io.BytesIO(encode(render(scene), "JPEG", 90)))).astype(int)
    shape = scene.shapes[0]
    assert np.abs(jpeg[shape.top + 3 * shape.size // 4, shape.left + shape.size // 2] - shape.rgb).max() < 40
    with pytest.raises(ValueError, match="unsupported format"):
        encode(render(scene), "GIF")
    lossless = render_file_like(scene, np.random.default_rng(0), jpeg_fraction=0.0)
    assert np.array_equal(np.asarray(lossless), np.asarray(render(scene)))


def test_shape_map_names_the_shape_covering_each_cell():
    scene = Scene(400, 200, "white", BACKGROUNDS["white"],
                  (Shape("square", "red", 100, 0, 100, COLOURS["red"]),       # exactly cell (row 0, col 1) and (1, 1)
                   Shape("circle", "blue", 300, 100, 100, COLOURS["blue"]),   # inside cells (2, 3) and (3, 3)
                   Shape("triangle", "green", 0, 150, 12, COLOURS["green"])))  # too small for its cell
    expected = np.full((4, 4), -1)
    expected[0:2, 1] = 0
    expected[2:4, 3] = 1
    assert np.array_equal(shape_map(scene, 4).reshape(4, 4), expected)
    assert np.array_equal(shape_map(scene, 4, resolution=100).reshape(4, 4), expected)  # drawn smaller


def test_scene_from_dict_inverts_asdict():
    import dataclasses
    import json

    for s in _scenes(10):
        assert scene_from_dict(json.loads(json.dumps(dataclasses.asdict(s)))) == s


# ------------------------------------------------------------------------------------------------ answers


def test_answer_templates():
    s = _scene("white", ("square", "blue"), ("circle", "red"), ("square", "blue"))
    assert sd.describe(s) == "A red circle and two blue squares on a white background."
    assert sd.count_answer(s) == "There are 3 shapes."
    assert sd.colour_answer(s, "circle") == "The circle is red."
    assert sd.colour_answer(s, "square") == "The squares are both blue."
    assert sd.colour_answer(s, "triangle") == "There is no triangle."
    assert sd.presence_answer(s, "circle") == "Yes, there is a red circle."
    assert sd.presence_answer(s, "square") == "Yes, there are 2 squares."
    assert sd.presence_answer(s, "triangle") == "No, there is no triangle."
    assert sd.background_answer(s) == "The background is white."
    one = _scene("light grey", ("triangle", "orange"))
    assert sd.describe(one) == "An orange triangle on a light grey background."
    assert sd.presence_answer(one, "triangle") == "Yes, there is an orange triangle."
    assert sd.count_answer(one) == "There is 1 shape."
    mixed = _scene("navy", ("triangle", "yellow"), ("triangle", "green"), ("circle", "purple"))
    assert sd.describe(mixed) == "A purple circle, a green triangle and a yellow triangle on a navy background."
    assert sd.colour_answer(mixed, "triangle") == "The triangles are green and yellow."
    assert sd.describe_many([one, s]) == f"Image 1: {sd.describe(one)} Image 2: {sd.describe(s)}"
    assert len(s.shapes) > 1
    assert sd.compare_answer([one, s]) == (f"The first image has 1 shape and the second has {len(s.shapes)}, "
                                           "so the second image has more shapes.")
    assert sd.compare_answer([s, one]) == (f"The first image has {len(s.shapes)} shapes and the second has 1, "
                                           "so the first image has more shapes.")
    assert sd.compare_answer([one, one]) == ("The first image has 1 shape and the second has 1, "
                                             "so both have the same number of shapes.")


def test_descriptions_parse_back_to_the_scene():
    for s in _scenes(300, seed=5):
        assert sd.parse_description(sd.describe(s)) == (sd.scene_counts(s), s.background)
        assert sd.parse_count(sd.count_answer(s)) == len(s.shapes)
    for bad in ("A pink circle on a white background.", "A red hexagon on a white background.",
                "A red circle on a purple background.", "Hello", "", "A red circle and on a white background.",
                "There are many shapes."):
        assert sd.parse_description(bad) is None
    assert sd.parse_count("There are many shapes.") is None


def test_training_conversations():
    rng = np.random.default_rng(7)
    kinds = collections.Counter()
    for _ in range(120):
        for kind in ("short", "long"):
            conv = sd.sample_conversation(rng, kind)
            images = [p for m in conv.messages for p in m["content"] if p["type"] == "image"]
            assert len(images) == len(conv.scenes)
            assert conv.messages[-1]["role"] == "assistant"
            answers = [m["content"][0]["text"] for m in conv.messages if m["role"] == "assistant"]
            if not conv.scenes:
                assert answers == [sd.TEXT_ONLY_ANSWER]
                kinds["text"] += 1
            elif kind == "short":
                assert len(images) == 1 and len(answers) == 1
                s = conv.scenes[0]
                templates = {sd.describe(s), sd.count_answer(s), sd.background_answer(s)}
                templates |= {f(s, k) for f in (sd.colour_answer, sd.presence_answer) for k in KINDS}
                assert answers[0] in templates
                kinds["single"] += 1
            else:
                assert len(answers) == 2 or len(images) >= 2
                kinds["long"] += 1
    assert kinds["text"] > 0 and kinds["single"] > 0 and kinds["long"] > 0
    with pytest.raises(ValueError, match="unknown conversation kind"):
        sd.sample_conversation(rng, "huge")


# ------------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_layout_and_template_words():
    vocab = dict(shape_vocab()[0])
    ids = special_token_ids()
    assert [ids[t] for t in ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")] \
        == list(range(7))
    assert [ids[t] for t in ("<start_of_image>", "<end_of_image>", "<image_soft_token>")] == \
        [len(vocab) - 3, len(vocab) - 2, len(vocab) - 1]
    assert sorted(vocab.values()) == list(range(len(vocab)))
    tok = build_shape_tokenizer()
    for line in corpus().splitlines():  # every space-separated chunk of the templates is one token
        assert len(tok.encode(line, add_special_tokens=False).ids) == len(line.split(" ")), line


@pytest.mark.parametrize("text", ["Describe this image.", "  odd   spacing ", "café, 日本語 🙂 {}<>", "a\nb\n\nc",
                                  ""])
def test_tokenizer_round_trip(text):
    tok = build_shape_tokenizer()
    enc = tok.encode(text)
    assert enc.ids[:1] == [special_token_ids()["<bos>"]]
    assert tok.decode(enc.ids[1:], skip_special_tokens=False) == text
