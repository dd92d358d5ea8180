"""Media sources given as paths: str, bytes and os.PathLike become a local path; URLs are refused by name."""

import pathlib

import pytest

from omnijax.common.errors import MediaError
from omnijax.preprocess.sources import local_path


def test_local_path_accepts_str_bytes_and_pathlike(tmp_path):
    target = tmp_path / "clip.wav"
    for source in (str(target), bytes(target), target):
        assert local_path(source, "audio") == target


@pytest.mark.parametrize("url", ["http://example.com/a.png", "https://example.com/b.wav"])
def test_local_path_refuses_urls_naming_the_media_kind(url):
    with pytest.raises(MediaError, match=r"^image URLs are not fetched; download the file first: " + url):
        local_path(url, "image")


def test_local_path_keeps_relative_paths_relative():
    assert local_path("examples/shapes.png", "image") == pathlib.Path("examples/shapes.png")
