"""Llama 4 prompts: the chat template, each image tiled (preprocess/llama4/image.py) and its ``<|image|>`` expanded
into its own run of ``<|patch|>`` tokens (tile rows, separators, global tile; preprocess/llama4/prompt.py), the
image's tiles as its media item (batched by preprocess/llama4/image_batch.py). A text-only checkpoint takes no
images."""

from __future__ import annotations

import pathlib

from omnijax.common.errors import CheckpointError
from omnijax.preprocess.images import load_image
from omnijax.preprocess.llama4.image import Llama4ImageConfig, process_images
from omnijax.preprocess.llama4.image_batch import collate
from omnijax.preprocess.llama4.prompt import (IMAGE_END, IMAGE_START, PATCH, TILE_X_SEPARATOR, TILE_Y_SEPARATOR,
                                              Llama4PromptConfig, expand_image_placeholders)
from omnijax.preprocess.processor import MediaItems, Modality, Processor
from omnijax.preprocess.tokenizer import load_tokenizer


class Llama4Processor(Processor):
    """image_token_id: the model's image placeholder id (the tokenizer's ``<|patch|>``); None for a text-only
    checkpoint. ``tokens_per_tile`` follows from the processor settings (preprocess/llama4/prompt.py)."""

    roles = ("system", "user", "assistant", "ipython", "tool")  # the roles its chat template knows
    tool_format = "llama4"  # how its model writes tool calls (app/tools.py)

    def __init__(self, folder: pathlib.Path, *, image_token_id: int | None):
        tokenizer = load_tokenizer(folder)
        if not getattr(tokenizer, "chat_template", None):
            raise CheckpointError(f"no chat template found in {str(folder)!r}")
        if image_token_id is None:
            super().__init__(tokenizer)
            return
        self.image_cfg = Llama4ImageConfig.from_folder(folder)
        self.prompt_cfg = Llama4PromptConfig.from_folder(folder)
        self.tokens_per_tile = self.prompt_cfg.tokens_per_tile(self.image_cfg.tile_size)
        vocab = tokenizer.get_vocab()
        for token in (IMAGE_START, IMAGE_END, PATCH, TILE_X_SEPARATOR, TILE_Y_SEPARATOR, self.prompt_cfg.image_token):
            if token not in vocab:
                raise CheckpointError(f"the tokenizer has no {token!r} token")
        if vocab[PATCH] != image_token_id:
            raise CheckpointError(f"the model's image token id {image_token_id} is not the tokenizer's {PATCH} "
                                  f"({vocab[PATCH]})")
        super().__init__(tokenizer, {"image": Modality(image_token_id, self.process_images, collate)})

    def process_images(self, sources: list) -> MediaItems:
        """Tiles [n, 3, S, S] per image (row-major, then the global tile); n * tokens_per_tile soft tokens; the
        layout (rows, cols)."""
        tiles = process_images([load_image(source) for source in sources], self.image_cfg)
        return MediaItems([t.tiles for t in tiles], [t.num_tiles * self.tokens_per_tile for t in tiles],
                          [(t.rows, t.cols) for t in tiles])

    def expand(self, text: str, media: dict[str, MediaItems]) -> str:
        if "image" not in self.modalities:
            return text
        # (an <|image|> typed in user text is escaped: it is no placeholder)
        layouts = media["image"].layouts if "image" in media else []
        return expand_image_placeholders(text, layouts, self.tokens_per_tile, self.prompt_cfg.image_token)
