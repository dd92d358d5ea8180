"""Write the example pictures of examples/ and their manifest, examples/examples.json.

    python scripts/make_examples.py

examples/shapes.png is the README's first command's picture; the web demo offers every entry of the manifest
(pictures plus a prompt) as a clickable example. Each entry records the scenes it shows and the answer the
default model's templates give (training/dialogues.py), so tests can check the pictures and the answers.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from training import dialogues as sd  # noqa: E402
from training.scenes import BACKGROUNDS, COLOURS, Scene, Shape, encode, render  # noqa: E402


def scene(width: int, height: int, background: str, *shapes: tuple[str, str, int, int, int]) -> Scene:
    """A scene with exact colours: shapes as (kind, colour, left, top, size)."""
    return Scene(width, height, background, BACKGROUNDS[background],
                 tuple(Shape(k, c, x, y, s, COLOURS[c]) for k, c, x, y, s in shapes))


PICTURES = {
    "shapes.png": scene(320, 240, "white", ("circle", "red", 30, 40, 90), ("square", "blue", 190, 30, 80),
                        ("triangle", "green", 120, 150, 75)),
    "night.jpg": scene(480, 300, "navy", ("triangle", "yellow", 60, 70, 110), ("circle", "orange", 300, 120, 100)),
    "tall.png": scene(200, 360, "beige", ("square", "purple", 50, 130, 70)),
    "pair.png": scene(256, 256, "light grey", ("circle", "green", 30, 40, 60), ("circle", "blue", 150, 150, 70),
                      ("square", "red", 160, 30, 50)),
}

# (pictures, prompt, answer)
EXAMPLES = [
    (["shapes.png"], "Describe this image.", lambda s: sd.describe(s[0])),
    (["night.jpg"], "How many shapes are there?", lambda s: sd.count_answer(s[0])),
    (["night.jpg"], "What colour is the triangle?", lambda s: sd.colour_answer(s[0], "triangle")),
    (["tall.png"], "Is there a circle?", lambda s: sd.presence_answer(s[0], "circle")),
    (["pair.png"], "Describe this image.", lambda s: sd.describe(s[0])),
    (["tall.png", "pair.png"], "Which image has more shapes?", lambda s: sd.compare_answer(s)),
]


def main() -> int:
    folder = ROOT / "examples"
    folder.mkdir(exist_ok=True)
    for name, s in PICTURES.items():
        fmt = "JPEG" if name.endswith(".jpg") else "PNG"
        (folder / name).write_bytes(encode(render(s), fmt, quality=92))
    manifest = {
        "pictures": {name: dataclasses.asdict(s) for name, s in PICTURES.items()},
        "examples": [{"files": files, "prompt": prompt, "answer": answer([PICTURES[f] for f in files])}
                     for files, prompt, answer in EXAMPLES],
    }
    (folder / "examples.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
