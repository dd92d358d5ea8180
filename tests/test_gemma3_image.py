"""Gemma 3 image preprocessing against transformers' Gemma3ImageProcessorPil, plus image loading errors."""

import io
import json

import numpy as np
import PIL.Image
import pytest
from transformers.image_utils import SizeDict
from transformers.image_utils import load_image as hf_load_image
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.gemma3.image import (
    Gemma3ImageConfig,
    pan_and_scan_boxes,
    pan_and_scan_crops,
    process_images,
)
from omnijax.preprocess.pixels import rescale_normalize, resize, to_chw_uint8
from omnijax.preprocess.images import convert_rgb, load_image

pytestmark = pytest.mark.reference

TOL = 1e-5


def hf_processor(cfg: Gemma3ImageConfig, **overrides) -> Gemma3ImageProcessorPil:
    kwargs = dict(
        size={"height": cfg.height, "width": cfg.width},
        resample=cfg.resample,
        rescale_factor=cfg.rescale_factor,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
        do_resize=cfg.do_resize,
        do_rescale=cfg.do_rescale,
        do_normalize=cfg.do_normalize,
        do_convert_rgb=cfg.do_convert_rgb,
        do_pan_and_scan=cfg.do_pan_and_scan,
        pan_and_scan_min_crop_size=cfg.pan_and_scan_min_crop_size,
        pan_and_scan_max_num_crops=cfg.pan_and_scan_max_num_crops,
        pan_and_scan_min_ratio_to_activate=cfg.pan_and_scan_min_ratio_to_activate,
    )
    kwargs.update(overrides)
    return Gemma3ImageProcessorPil(**kwargs)


def hf_process(cfg, images, **overrides):
    out = hf_processor(cfg, **overrides)(images, return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), [int(n) for n in out["num_crops"]]


def random_rgb(rng, height, width, channels=3):
    return rng.integers(0, 256, (height, width, channels), dtype=np.uint8)


def assert_parity(cfg, ours_input, hf_input, expect_crops=None, **overrides):
    ours, ours_crops = process_images(ours_input, cfg)
    ref, ref_crops = hf_process(cfg, hf_input, **overrides)
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    assert ours_crops == ref_crops
    if expect_crops is not None:
        assert ours_crops == expect_crops
    assert ours.shape == (len(ours_crops) + sum(ours_crops), 3, cfg.height, cfg.width)
    diff = float(np.abs(ours - ref).max())
    assert diff <= TOL, diff
    return ours_crops


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------------------------
# End-to-end parity with the reference


@pytest.mark.parametrize("size", [64, 896])
def test_odd_size_rgb(rng, size):
    img = PIL.Image.fromarray(random_rgb(rng, 37, 53))
    cfg = Gemma3ImageConfig(height=size, width=size)
    assert_parity(cfg, [img], [img], expect_crops=[0])


def test_landscape_pan_and_scan_896(rng):
    img = PIL.Image.fromarray(random_rgb(rng, 600, 1700))
    cfg = Gemma3ImageConfig(height=896, width=896, do_pan_and_scan=True)
    crops = assert_parity(cfg, [img], [img])
    assert crops == [3]


def test_portrait_pan_and_scan(rng):
    img = PIL.Image.fromarray(random_rgb(rng, 1500, 400))
    cfg = Gemma3ImageConfig(height=64, width=64, do_pan_and_scan=True)
    crops = assert_parity(cfg, [img], [img])
    assert crops == [4]  # round(3.75) = 4, capped by floor(1500 / 256) = 5 and max_num_crops 4


def test_square_does_not_activate_pan_and_scan(rng):
    img = PIL.Image.fromarray(random_rgb(rng, 700, 720))
    cfg = Gemma3ImageConfig(height=64, width=64, do_pan_and_scan=True)
    assert_parity(cfg, [img], [img], expect_crops=[0])


def test_batch_order_images_followed_by_their_crops(rng):
    imgs = [
        PIL.Image.fromarray(random_rgb(rng, 300, 900)),
        PIL.Image.fromarray(random_rgb(rng, 80, 90)),
        PIL.Image.fromarray(random_rgb(rng, 1100, 520)),
    ]
    cfg = Gemma3ImageConfig(height=48, width=48, do_pan_and_scan=True)
    crops = assert_parity(cfg, imgs, imgs)
    assert crops[1] == 0 and crops[0] > 0 and crops[2] > 0


def test_rgba_image_composited_on_white(rng):
    data = random_rgb(rng, 41, 67, channels=4)
    data[:10, :, 3] = 0  # fully transparent band becomes white
    img = PIL.Image.fromarray(data, mode="RGBA")
    cfg = Gemma3ImageConfig(height=64, width=64)
    assert_parity(cfg, [img], [img])
    assert_parity(cfg, [load_image(img)], [img])
    assert np.all(np.asarray(load_image(img))[:10] == 255)


def test_grayscale_and_palette_images(rng):
    gray = PIL.Image.fromarray(random_rgb(rng, 45, 31, channels=1)[:, :, 0], mode="L")
    palette = PIL.Image.fromarray(random_rgb(rng, 45, 31)).convert("P")
    palette.info["transparency"] = 3
    la = PIL.Image.fromarray(random_rgb(rng, 45, 31, channels=4)[:, :, :2], mode="LA")
    cfg = Gemma3ImageConfig(height=64, width=64)
    for img in (gray, palette, la):
        assert_parity(cfg, [img], [img])
        assert_parity(cfg, [load_image(img)], [img])


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_numpy_input(rng, channels):
    data = random_rgb(rng, 50, 70, channels=channels)
    cfg = Gemma3ImageConfig(height=64, width=64, do_pan_and_scan=True, pan_and_scan_min_crop_size=16)
    assert_parity(cfg, [load_image(data)], [data])
    assert_parity(cfg, [data], [data])


def test_numpy_grayscale_hw(rng):
    data = random_rgb(rng, 33, 29, channels=1)
    cfg = Gemma3ImageConfig(height=32, width=32)
    # transformers does not take [H, W] arrays; the [H, W, 1] array is the same image.
    assert_parity(cfg, [load_image(data[:, :, 0])], [data])


def test_float_numpy_input_matches_reference_without_its_rescale(rng):
    data = rng.random((40, 60, 3), dtype=np.float64)
    cfg = Gemma3ImageConfig(height=32, width=32)
    # transformers' processor multiplies float input by 255 (truncating to uint8) around the PIL resize and divides
    # it back, so its do_rescale must be off for float input; ours turns the floats into uint8 the same way.
    assert_parity(cfg, [load_image(data)], [data], do_rescale=False)


def test_path_input_matches_reference_given_the_path(rng, tmp_path):
    data = random_rgb(rng, 30, 44, channels=4)
    path = tmp_path / "rgba.png"
    PIL.Image.fromarray(data, mode="RGBA").save(path)
    cfg = Gemma3ImageConfig(height=64, width=64)
    assert_parity(cfg, [load_image(path)], [str(path)])
    assert_parity(cfg, [load_image(str(path))], [str(path)])


def test_without_normalize_or_rescale(rng):
    img = PIL.Image.fromarray(random_rgb(rng, 20, 70))
    for flags in ({"do_normalize": False}, {"do_rescale": False}):
        cfg = Gemma3ImageConfig(height=24, width=24, do_pan_and_scan=True, pan_and_scan_min_crop_size=8, **flags)
        assert_parity(cfg, [img], [img])


def test_other_settings(rng):
    img = PIL.Image.fromarray(random_rgb(rng, 91, 203))
    cfg = Gemma3ImageConfig(
        height=40,
        width=56,
        resample=int(PIL.Image.Resampling.BICUBIC),
        image_mean=(0.48145466, 0.4578275, 0.40821073),
        image_std=(0.26862954, 0.26130258, 0.27577711),
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=30,
        pan_and_scan_max_num_crops=3,
        pan_and_scan_min_ratio_to_activate=1.5,
    )
    assert_parity(cfg, [img], [img], expect_crops=[2])


# ---------------------------------------------------------------------------------------------------------------
# The pieces on their own


def test_pan_and_scan_boxes_match_reference_over_many_sizes():
    ref = Gemma3ImageProcessorPil()
    cfgs = [
        Gemma3ImageConfig(),
        Gemma3ImageConfig(
            pan_and_scan_min_crop_size=100, pan_and_scan_max_num_crops=7, pan_and_scan_min_ratio_to_activate=1.0
        ),
    ]
    sizes = [(h, w) for h in (100, 255, 256, 257, 512, 700, 1024, 2000) for w in (90, 256, 300, 511, 777, 1700, 3001)]
    for cfg in cfgs:
        for height, width in sizes:
            rows = np.broadcast_to(np.arange(height)[None, :, None], (1, height, width))
            cols = np.broadcast_to(np.arange(width)[None, None, :], (1, height, width))
            kwargs = dict(
                pan_and_scan_min_crop_size=cfg.pan_and_scan_min_crop_size,
                pan_and_scan_max_num_crops=cfg.pan_and_scan_max_num_crops,
                pan_and_scan_min_ratio_to_activate=cfg.pan_and_scan_min_ratio_to_activate,
            )
            ref_rows = ref.pan_and_scan(rows, **kwargs)
            ref_cols = ref.pan_and_scan(cols, **kwargs)
            expected = [
                (int(r[0, 0, 0]), int(c[0, 0, 0]), int(r[0, -1, 0]) + 1, int(c[0, 0, -1]) + 1)
                for r, c in zip(ref_rows, ref_cols)
            ]
            assert pan_and_scan_boxes(height, width, cfg) == expected, (height, width)
            ours = pan_and_scan_crops(rows, cfg)
            assert [o.shape for o in ours] == [r.shape for r in ref_rows]


def test_pan_and_scan_crops_from_pil(rng):
    data = random_rgb(rng, 300, 800)
    cfg = Gemma3ImageConfig()
    crops = pan_and_scan_crops(PIL.Image.fromarray(data), cfg)
    ref = Gemma3ImageProcessorPil().pan_and_scan(
        np.moveaxis(data, -1, 0),
        pan_and_scan_min_crop_size=256,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )
    assert len(crops) == len(ref) == 3
    for ours, theirs in zip(crops, ref):
        np.testing.assert_array_equal(ours, theirs)


def test_resize_matches_reference(rng):
    chw = np.moveaxis(random_rgb(rng, 37, 53), -1, 0)
    ref = Gemma3ImageProcessorPil()
    for resample in (PIL.Image.Resampling.BILINEAR, PIL.Image.Resampling.BICUBIC, PIL.Image.Resampling.NEAREST):
        theirs = ref.resize(chw, SizeDict(height=64, width=80), resample=resample)
        ours = resize(chw, 64, 80, int(resample))
        assert ours.dtype == theirs.dtype == np.uint8
        np.testing.assert_array_equal(ours, theirs)


def test_rescale_normalize_matches_reference(rng):
    chw = np.moveaxis(random_rgb(rng, 16, 24), -1, 0)
    cfg = Gemma3ImageConfig(image_mean=(0.1, 0.2, 0.3), image_std=(0.7, 0.5, 0.9))
    ref = Gemma3ImageProcessorPil()
    theirs = ref.normalize(ref.rescale(chw, cfg.rescale_factor), list(cfg.image_mean), list(cfg.image_std))
    ours = rescale_normalize(chw, cfg)
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)


def test_to_chw_uint8_and_convert_rgb(rng):
    data = random_rgb(rng, 5, 7)
    chw = to_chw_uint8(PIL.Image.fromarray(data))
    assert chw.shape == (3, 5, 7) and chw.dtype == np.uint8
    np.testing.assert_array_equal(chw, np.moveaxis(data, -1, 0))
    assert convert_rgb(PIL.Image.fromarray(data[:, :, 0], mode="L")).mode == "RGB"
    with pytest.raises(MediaError, match="mode"):
        to_chw_uint8(PIL.Image.fromarray(data[:, :, 0], mode="L"), do_convert_rgb=False)


# ---------------------------------------------------------------------------------------------------------------
# load_image


def test_load_image_missing_path(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(MediaError, match="not found") as info:
        load_image(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(MediaError):
        load_image(str(missing))
    with pytest.raises(MediaError, match="not a file"):
        load_image(tmp_path)


def test_load_image_corrupt_file(tmp_path, rng):
    bad = tmp_path / "x.jpg"
    bad.write_bytes(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
    with pytest.raises(MediaError) as info:
        load_image(bad)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_load_image_truncated_file(tmp_path, rng, fmt):
    buf = io.BytesIO()
    PIL.Image.fromarray(random_rgb(rng, 64, 64)).save(buf, format=fmt)
    data = buf.getvalue()
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(MediaError) as info:
        load_image(path)
    assert str(path) in str(info.value)


def test_load_image_applies_exif_orientation_like_transformers(tmp_path, rng):
    img = PIL.Image.fromarray(random_rgb(rng, 20, 30))
    exif = PIL.Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    path = tmp_path / "rot.jpg"
    img.save(path, exif=exif, quality=95)
    ours = load_image(path)
    theirs = hf_load_image(str(path))
    assert ours.mode == "RGB" and ours.size == theirs.size == (20, 30)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_load_image_good_inputs(rng):
    data = random_rgb(rng, 6, 9)
    for source in (data, data[:, :, :1], data[:, :, 0], PIL.Image.fromarray(data)):
        out = load_image(source)
        assert isinstance(out, PIL.Image.Image) and out.mode == "RGB" and out.size == (9, 6)
    np.testing.assert_array_equal(np.asarray(load_image(data)), data)


@pytest.mark.parametrize(
    "array, pattern",
    [
        (np.zeros((3, 64, 64), np.uint8), "channels"),
        (np.zeros((2, 4, 4, 3), np.uint8), "shape"),
        (np.zeros((8,), np.uint8), "shape"),
        (np.zeros((0, 5, 3), np.uint8), "zero size"),
        (np.zeros((4, 4, 3), np.uint16), "dtype"),
        (np.full((4, 4, 3), 2.0, np.float32), r"\[0, 1\]"),
        (np.full((4, 4, 3), np.nan, np.float32), "NaN"),
    ],
)
def test_load_image_bad_arrays(array, pattern):
    with pytest.raises(MediaError, match=pattern):
        load_image(array)


def test_load_image_other_bad_sources():
    with pytest.raises(MediaError, match="zero size"):
        load_image(PIL.Image.new("RGB", (0, 4)))
    with pytest.raises(MediaError, match="URL"):
        load_image("https://example.com/cat.png")
    with pytest.raises(MediaError, match="int"):
        load_image(42)


# ---------------------------------------------------------------------------------------------------------------
# Config


def config_from_hf(processor: Gemma3ImageProcessorPil) -> dict:
    return dict(
        height=processor.size["height"],
        width=processor.size["width"],
        resample=int(processor.resample),
        rescale_factor=processor.rescale_factor,
        image_mean=tuple(processor.image_mean),
        image_std=tuple(processor.image_std),
        do_resize=processor.do_resize,
        do_rescale=processor.do_rescale,
        do_normalize=processor.do_normalize,
        do_convert_rgb=processor.do_convert_rgb,
    )


def test_from_dict_defaults_are_the_reference_defaults():
    cfg = Gemma3ImageConfig.from_dict({})
    assert cfg == Gemma3ImageConfig()
    for key, value in config_from_hf(Gemma3ImageProcessorPil()).items():
        assert getattr(cfg, key) == value, key
    assert (cfg.do_pan_and_scan, cfg.pan_and_scan_min_crop_size, cfg.pan_and_scan_max_num_crops) == (False, 256, 4)
    assert cfg.pan_and_scan_min_ratio_to_activate == 1.2


def test_from_dict_hub_style_config_with_nulls():
    d = {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor",
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896},
    }
    cfg = Gemma3ImageConfig.from_dict(d)
    assert cfg == Gemma3ImageConfig(height=896, width=896)


def test_from_folder_preprocessor_config_saved_by_transformers(tmp_path, rng):
    settings = Gemma3ImageConfig(
        height=96,
        width=80,
        resample=3,
        image_mean=(0.1, 0.2, 0.3),
        image_std=(0.4, 0.5, 0.6),
        do_pan_and_scan=True,
        pan_and_scan_min_crop_size=32,
        pan_and_scan_max_num_crops=3,
        pan_and_scan_min_ratio_to_activate=1.4,
    )
    hf_processor(settings).save_pretrained(tmp_path)
    assert (tmp_path / "preprocessor_config.json").is_file()
    cfg = Gemma3ImageConfig.from_folder(tmp_path)
    assert cfg == settings
    reloaded = Gemma3ImageProcessorPil.from_pretrained(tmp_path)
    for key, value in config_from_hf(reloaded).items():
        assert getattr(cfg, key) == value, key
    img = PIL.Image.fromarray(random_rgb(rng, 70, 150))
    ours, crops = process_images([img], cfg)
    out = reloaded(img, return_tensors="np")
    assert crops == [int(n) for n in out["num_crops"]] == [2]
    assert float(np.abs(ours - out["pixel_values"]).max()) <= TOL


def test_from_folder_processor_config_saved_by_transformers(tmp_path):
    from transformers import Gemma3Processor, GemmaTokenizer

    tokenizer = GemmaTokenizer(
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        }
    )
    settings = Gemma3ImageConfig(height=896, width=896, pan_and_scan_min_crop_size=300)
    Gemma3Processor(image_processor=hf_processor(settings), tokenizer=tokenizer).save_pretrained(tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()
    section = json.loads((tmp_path / "processor_config.json").read_text())["image_processor"]
    assert section["size"] == {"height": 896, "width": 896}
    assert Gemma3ImageConfig.from_folder(tmp_path) == settings
    # The nested section wins over a stale preprocessor_config.json, as in transformers.
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 10, "width": 10}}))
    assert Gemma3ImageConfig.from_folder(tmp_path) == settings


def test_from_folder_falls_back_to_preprocessor_config(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 32, "width": 48}}))
    assert Gemma3ImageConfig.from_folder(tmp_path) == Gemma3ImageConfig(height=32, width=48)


def test_from_folder_errors(tmp_path):
    with pytest.raises(CheckpointError, match="preprocessor_config.json") as info:
        Gemma3ImageConfig.from_folder(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(CheckpointError, match="not found"):
        Gemma3ImageConfig.from_folder(tmp_path / "missing")
    broken = tmp_path / "preprocessor_config.json"
    broken.write_text("{not json")
    with pytest.raises(CheckpointError) as info:
        Gemma3ImageConfig.from_folder(tmp_path)
    assert str(broken) in str(info.value)
    broken.write_text(json.dumps({"size": {"shortest_edge": 224}}))
    with pytest.raises(CheckpointError, match="size"):
        Gemma3ImageConfig.from_folder(tmp_path)
    broken.write_text(json.dumps({"image_mean": [0.5, 0.5]}))
    with pytest.raises(CheckpointError, match="image_mean"):
        Gemma3ImageConfig.from_folder(tmp_path)
    broken.write_text(json.dumps({"do_resize": "yes"}))
    with pytest.raises(CheckpointError, match="do_resize"):
        Gemma3ImageConfig.from_folder(tmp_path)


def test_config_is_frozen_and_hashable():
    cfg = Gemma3ImageConfig(image_mean=[0.5, 0.5, 0.5])
    assert cfg.image_mean == (0.5, 0.5, 0.5)
    hash(cfg)
    with pytest.raises(Exception):
        cfg.height = 3  # type: ignore[misc]
