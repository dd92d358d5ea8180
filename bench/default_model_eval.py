"""Evaluate the embedded default model on freshly drawn shape scenes it was not trained on.

    python -m bench.default_model_eval [--model DIR] [--scenes 200] [--seed 20250101]

For each scene (half of them read back from JPEG, half lossless) the model is asked, greedily:

* "Describe this image.": right when the description names exactly the scene's set of (colour, shape) pairs
  (``describe_pairs``); ``describe_exact`` also needs every count and the background right;
* "How many shapes are there?": right when the number is;
* "What colour is the <kind>?" (a kind in the scene), "Is there a <kind>?" (a random kind) and "What colour is
  the background?": right when the answer is the template's answer word for word;
* "Which image has more shapes?" on consecutive pairs of the pictures (``compare``): right when the answer is the
  template's answer word for word.

Training draws its scenes from ``numpy.random.default_rng([seed, step])``; these come from
``numpy.random.default_rng(seed)`` with a different seed, so they are new pictures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from training import dialogues as sd
from training.scenes import KINDS, Scene, render_file_like, sample_scene

EVAL_SEED = 20250101


@dataclasses.dataclass
class EvalItem:
    scene: Scene
    image: object  # PIL image


def eval_items(n: int = 200, seed: int = EVAL_SEED) -> list[EvalItem]:
    """``n`` scenes and their pictures (every second one through JPEG), all from ``seed``."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        scene = sample_scene(rng)
        items.append(EvalItem(scene, render_file_like(scene, rng, jpeg_fraction=float(i % 2))))
    return items


def _ask(pipe, items: list[EvalItem] | list[list[EvalItem]], questions: list[str], batch: int,
         **sampling) -> list[str]:
    """Greedy (or sampled) answers to ``questions[i]`` about the picture ``items[i]`` (or the pictures, a list)."""
    answers: list[str] = []
    for start in range(0, len(items), batch):
        chunk = list(zip(items[start:start + batch], questions[start:start + batch]))
        conversations = [[{"role": "user", "content": [{"type": "image", "image": it.image}
                                                       for it in (group if isinstance(group, list) else [group])]
                           + [{"type": "text", "text": q}]}] for group, q in chunk]
        results = pipe.generate(conversations, max_new_tokens=40, **sampling)
        answers += [r.text for r in results]
    return answers


def describe_scores(items: list[EvalItem], answers: list[str]) -> dict[str, float]:
    """Fractions of descriptions naming the right set of (colour, shape) pairs, and right in every detail."""
    pairs = exact = 0
    for it, text in zip(items, answers):
        parsed = sd.parse_description(text)
        if parsed is None:
            continue
        counts, background = parsed
        truth = sd.scene_counts(it.scene)
        pairs += set(counts) == set(truth)
        exact += counts == truth and background == it.scene.background
    return {"describe_pairs": pairs / len(items), "describe_exact": exact / len(items)}


def count_score(items: list[EvalItem], answers: list[str]) -> float:
    return float(np.mean([sd.parse_count(a) == len(it.scene.shapes) for it, a in zip(items, answers)]))


def evaluate(pipe, items: list[EvalItem], *, batch: int = 200, extended: bool = True,
             temperature: float = 0.0, seed: int = 0) -> dict:
    """Scores of ``pipe`` on ``items`` (see the module docstring); ``extended`` adds the colour, presence and
    background questions. Also returns a few example answers."""
    sampling = dict(temperature=temperature, seed=seed)
    if temperature > 0:
        sampling.update(top_k=64, top_p=0.95)
    n = len(items)
    describe = _ask(pipe, items, ["Describe this image."] * n, batch, **sampling)
    count = _ask(pipe, items, ["How many shapes are there?"] * n, batch, **sampling)
    scores = {"scenes": n, **describe_scores(items, describe), "count": count_score(items, count)}
    examples = [{"truth": sd.describe(it.scene), "answer": a} for it, a in zip(items[:3], describe[:3])]
    if extended:
        rng = np.random.default_rng(0)
        kinds = [it.scene.shapes[int(rng.integers(len(it.scene.shapes)))].kind for it in items]
        asked = [KINDS[int(rng.integers(len(KINDS)))] for _ in items]
        colour = _ask(pipe, items, [f"What colour is the {k}?" for k in kinds], batch, **sampling)
        presence = _ask(pipe, items, [f"Is there a {k}?" for k in asked], batch, **sampling)
        background = _ask(pipe, items, ["What colour is the background?"] * n, batch, **sampling)
        scores["colour"] = float(np.mean([a == sd.colour_answer(it.scene, k)
                                          for it, k, a in zip(items, kinds, colour)]))
        scores["presence"] = float(np.mean([a == sd.presence_answer(it.scene, k)
                                            for it, k, a in zip(items, asked, presence)]))
        scores["background"] = float(np.mean([a == sd.background_answer(it.scene)
                                              for it, a in zip(items, background)]))
        pairs = [items[i:i + 2] for i in range(0, n - 1, 2)]
        compare = _ask(pipe, pairs, ["Which image has more shapes?"] * len(pairs), batch, **sampling)
        scores["compare"] = float(np.mean([a == sd.compare_answer([p.scene for p in pair])
                                           for pair, a in zip(pairs, compare)]))
    return {"scores": scores, "examples": examples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Evaluate the embedded default model on held-out shape scenes")
    p.add_argument("--model", help="checkpoint folder (default: the embedded default model)")
    p.add_argument("--scenes", type=int, default=200)
    p.add_argument("--seed", type=int, default=EVAL_SEED)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: sample (top-k 64, top-p 0.95)")
    args = p.parse_args(argv)

    from omnijax.app.default_model import default_model_dir
    from omnijax.app.pipeline import Pipeline

    start = time.perf_counter()
    pipe = Pipeline.from_pretrained(args.model or default_model_dir())
    items = eval_items(args.scenes, args.seed)
    report = evaluate(pipe, items, batch=args.batch, temperature=args.temperature)
    report.update(model=str(pipe.folder), seed=args.seed, temperature=args.temperature,
                  seconds=round(time.perf_counter() - start, 1))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
