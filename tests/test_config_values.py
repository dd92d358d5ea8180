"""The small readers the processor configs share: per-channel constants, booleans, sizes, the CheckpointError
conversion (common.config_values), and the normalization-constant check of the image configs (preprocess.pixels)."""

from __future__ import annotations

import pytest

from omnijax.common.config_values import as_checkpoint_error, boolean, channel_floats, height_width
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.pixels import normalization_constants


def test_channel_floats_repeats_one_number_and_converts_lists():
    assert channel_floats(0.5, "image_mean") == (0.5, 0.5, 0.5)
    assert channel_floats(1, "image_std") == (1.0, 1.0, 1.0)
    out = channel_floats([1, 0.25, 2], "image_mean")
    assert out == (1.0, 0.25, 2.0) and all(type(v) is float for v in out)
    assert channel_floats((0.1, 0.2), "image_mean") == (0.1, 0.2)  # the count is the caller's check


@pytest.mark.parametrize("value, match", [
    ("0.5", r"^'image_mean' must be a list of 3 numbers, got '0.5'$"),
    (True, r"^'image_mean' must be a list of 3 numbers, got True$"),
    ({"r": 0.5}, r"^'image_mean' must be a list of 3 numbers, got \{'r': 0.5\}$"),
    ([0.5, "x", 0.5], r"^'image_mean' must be a number, got 'x'$"),
    ([0.5, False, 0.5], r"^'image_mean' must be a number, got False$"),
])
def test_channel_floats_refuses_non_numbers(value, match):
    with pytest.raises(ValueError, match=match):
        channel_floats(value, "image_mean")


def test_boolean_takes_only_json_booleans():
    assert boolean(True, "do_resize") is True
    assert boolean(False, "do_resize") is False
    for value in (1, 0, "true", None):
        with pytest.raises(ValueError, match=rf"^'do_resize' must be true or false, got {value!r}$"):
            boolean(value, "do_resize")


def test_height_width_reads_dicts_ints_and_the_default():
    expected = "{'height': H, 'width': W} for Gemma 3"
    assert height_width({"height": 32, "width": 48}, (1, 2), expected) == (32, 48)
    assert height_width(64, (1, 2), expected) == (64, 64)
    assert height_width(None, (896, 448), expected) == (896, 448)
    assert height_width({"height": 32.0, "width": 48}, (1, 2), expected) == (32, 48)
    for size in ("896", True, {"height": 32}, [32, 32]):
        with pytest.raises(ValueError, match=r"^'size' must be \{'height': H, 'width': W\} for Gemma 3, got "):
            height_width(size, (1, 2), expected)
    with pytest.raises(ValueError, match=r"^'size.width' must be an integer, got 4.5$"):
        height_width({"height": 32, "width": 4.5}, (1, 2), expected)


def test_as_checkpoint_error_names_the_source():
    with pytest.raises(CheckpointError, match=r"^cfg.json: 'x' must be true or false, got 1$") as info:
        with as_checkpoint_error("cfg.json"):
            boolean(1, "x")
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(CheckpointError, match=r"^cfg.json: bad type$"):
        with as_checkpoint_error("cfg.json"):
            raise TypeError("bad type")
    with pytest.raises(MediaError, match="^unchanged$"):  # other errors pass as they are
        with as_checkpoint_error("cfg.json"):
            raise MediaError("unchanged")
    with as_checkpoint_error("cfg.json"):
        value = 3
    assert value == 3


def test_normalization_constants():
    mean, std = normalization_constants([0, 0.5, 1], (0.25, 0.5, 2))
    assert mean == (0.0, 0.5, 1.0) and std == (0.25, 0.5, 2.0)
    assert all(type(v) is float for v in mean + std)
    with pytest.raises(ValueError, match=r"^image_mean and image_std need 3 values each, got \(0.5, 0.5\) and "
                                         r"\(1.0, 1.0, 1.0\)$"):
        normalization_constants([0.5, 0.5], [1, 1, 1])
    with pytest.raises(ValueError, match=r"^image_std must not contain 0, got \(1.0, 0.0, 1.0\)$"):
        normalization_constants([0.5] * 3, [1, 0, 1])
