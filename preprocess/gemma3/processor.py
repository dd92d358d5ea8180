"""Gemma 3 prompts: the chat template's ``<start_of_image>`` expanded to each image's soft tokens, pixel values.

As transformers' ``Gemma3Processor``: each image (and, with pan-and-scan, each of its crops) becomes a fixed-size
pixel array of ``tokens_per_image`` soft tokens (preprocess/gemma3/image.py); the i-th ``<start_of_image>`` marker
becomes ``\\n\\n<start_of_image>`` + the image token x tokens_per_image + ``<end_of_image>\\n\\n``, preceded for an
image with crops by "Here is the original image" and followed by "and here are some crops to help you see better"
and one such run per crop. Image soft tokens attend their block both ways.
"""

from __future__ import annotations

import functools
import pathlib

from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.gemma3.image import Gemma3ImageConfig, process_images
from omnijax.preprocess.gemma3.image_batch import collate
from omnijax.preprocess.images import load_image
from omnijax.preprocess.processor import MediaItems, Modality, Processor
from omnijax.preprocess.tokenizer import load_tokenizer


class Gemma3Processor(Processor):
    """image_token_id: the model's image placeholder id; tokens_per_image: soft tokens per image or crop
    (``mm_tokens_per_image``); pixel_shape: (channels, side, side) of the vision tower's input."""

    def __init__(self, folder: pathlib.Path, *, image_token_id: int, tokens_per_image: int,
                 pixel_shape: tuple[int, int, int]):
        tokenizer = load_tokenizer(folder)
        self.image_cfg = Gemma3ImageConfig.from_folder(folder)
        self.tokens_per_image = tokens_per_image
        vocab = tokenizer.get_vocab()
        self.boi = getattr(tokenizer, "boi_token", None) or "<start_of_image>"
        self.eoi = getattr(tokenizer, "eoi_token", None) or "<end_of_image>"
        inv = {v: k for k, v in vocab.items()}
        if image_token_id not in inv:
            raise CheckpointError(f"image token id {image_token_id} is not in the tokenizer's vocabulary")
        for token in (self.boi, self.eoi):
            if token not in vocab:
                raise CheckpointError(f"the tokenizer has no {token!r} token")
        self.full_image = f"\n\n{self.boi}{inv[image_token_id] * tokens_per_image}{self.eoi}\n\n"
        super().__init__(tokenizer, {"image": Modality(image_token_id, self.process_images,
                                                       functools.partial(collate, pixel_shape=pixel_shape),
                                                       bidirectional=True)})

    def process_images(self, sources: list) -> MediaItems:
        """Pixel values [3, H, W] per image and crop; an image with n crops has (1 + n) * tokens_per_image soft
        tokens, its layout is n."""
        values, num_crops = process_images([load_image(source) for source in sources], self.image_cfg)
        return MediaItems(list(values), [(1 + n) * self.tokens_per_image for n in num_crops], list(num_crops))

    def image_text(self, num_crops: int) -> str:
        if not num_crops:
            return self.full_image
        return (f"Here is the original image {self.full_image} and here are some crops to help you see better "
                + " ".join([self.full_image] * num_crops))

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        num_crops = media["image"].layouts if "image" in media else []
        pieces = text.split(self.boi)
        if len(pieces) - 1 != len(num_crops):
            raise PromptError(f"the prompt has {len(pieces) - 1} image markers for {len(num_crops)} images")
        return pieces[0] + "".join(self.image_text(n) + rest for n, rest in zip(num_crops, pieces[1:]))
