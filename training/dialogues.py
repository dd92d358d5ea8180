"""Questions about shape scenes and the embedded default model's answers to them (deterministic templates).

The default model answers:

* "Describe this image." (and close variants): every shape with its colour and the background, shapes ordered by
  kind (circle, square, triangle) then colour: "A red circle and two blue squares on a white background."
* "How many shapes are there?": "There is 1 shape." / "There are 2 shapes."
* "What colour is the circle?": "The circle is red." / "The circles are red and blue." / "There is no circle."
* "Is there a triangle?": "Yes, there is a blue triangle." / "Yes, there are 2 triangles." / "No, there is no
  triangle."
* "What colour is the background?": "The background is white."
* Several images with "Describe these images.": "Image 1: .... Image 2: ...."; "Which image has more shapes?":
  "The first image has 3 shapes and the second has 2, so the first image has more shapes." / "... so both have the
  same number of shapes." (each count first: a small model compares two numbers it has written far more reliably
  than two pictures at once)
* Text without an image: :data:`TEXT_ONLY_ANSWER`.

:func:`sample_conversation` draws a conversation (messages with images, and the answers the model is taught) for
training; :func:`parse_description` reads the shapes back out of a description for evaluation.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
import PIL.Image

from training.scenes import BACKGROUNDS, COLOURS, KINDS, Scene, render_file_like, sample_scene

TEXT_ONLY_ANSWER = ("I am a small demo model that describes simple pictures of shapes. Show me an image and ask "
                    "me to describe it, count the shapes or name their colours.")

DESCRIBE_PROMPTS = (
    "Describe this image.", "Describe the image.", "Describe this picture.", "Describe the picture.",
    "What is in this image?", "What is in the picture?", "What is in this picture?", "What do you see?",
    "What shapes are in this picture?", "What shapes are in this image?", "What shapes do you see?",
    "Describe this image in one sentence.", "What does this image show?", "Caption this image.",
    "Describe what you see.", "Write a caption for this image.", "What is shown here?",
)
DESCRIBE_MANY_PROMPTS = (
    "Describe these images.", "Describe each image.", "What is in these images?", "Describe the images.",
    "What do you see in these pictures?", "Describe these pictures.",
)
COUNT_PROMPTS = (
    "How many shapes are there?", "How many shapes are in this image?", "How many shapes are in the picture?",
    "How many shapes do you see?", "Count the shapes.", "How many objects are there?",
    "How many shapes are in this picture?", "How many shapes?",
)
COLOUR_PROMPTS = (
    "What colour is the {kind}?", "What color is the {kind}?", "Which colour is the {kind}?",
    "What is the colour of the {kind}?", "What is the color of the {kind}?", "What color is the {kind} in this image?",
    "What colour is the {kind} in the picture?",
)
PRESENCE_PROMPTS = (
    "Is there a {kind}?", "Is there a {kind} in this image?", "Do you see a {kind}?",
    "Is there a {kind} in the picture?",
    "Does this image have a {kind}?", "Is there any {kind}?",
)
BACKGROUND_PROMPTS = (
    "What colour is the background?", "What color is the background?", "What is the background colour?",
    "What is the color of the background?",
)
COMPARE_PROMPTS = (
    "Which image has more shapes?", "Which picture has more shapes?", "Which of the two images has more shapes?",
)
TEXT_ONLY_PROMPTS = (
    "Hello", "Hi!", "Hello, who are you?", "Who are you?", "What can you do?", "Help", "hi", "Hey there.",
    "What is your name?", "Tell me a joke.", "What is the capital of France?", "How are you?", "Thanks!",
    "Write a poem about the sea.", "What is 2 + 2?", "Good morning.", "Can you see images?",
    "Explain quantum physics.", "Translate 'hello' into French.", "What day is it today?",
)
SYSTEM_PROMPTS = ("You are a helpful assistant.", "Answer briefly.", "You describe images.", "Be concise.")

_NUMBER_WORDS = {2: "two", 3: "three"}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else kind + "s"


def _join(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def shape_groups(scene: Scene) -> list[tuple[str, str, int]]:
    """(colour, kind, how many) for each distinct coloured shape, ordered by kind (KINDS order) then colour
    (COLOURS order)."""
    counts = collections.Counter((s.colour, s.kind) for s in scene.shapes)
    colours = list(COLOURS)
    return [(c, k, n) for (c, k), n in sorted(counts.items(), key=lambda it: (KINDS.index(it[0][1]),
                                                                               colours.index(it[0][0])))]


def describe(scene: Scene) -> str:
    """"A red circle and two blue squares on a white background." ("an orange ...")"""
    items = [f"{_NUMBER_WORDS.get(n) or _article(colour)} {colour} {_plural(kind, n)}"
             for colour, kind, n in shape_groups(scene)]
    text = f"{_join(items)} on a {scene.background} background."
    return text[0].upper() + text[1:]


def count_answer(scene: Scene) -> str:
    n = len(scene.shapes)
    return "There is 1 shape." if n == 1 else f"There are {n} shapes."


def colour_answer(scene: Scene, kind: str) -> str:
    colours = [c for c in COLOURS for s in scene.shapes if s.kind == kind and s.colour == c]
    if not colours:
        return f"There is no {kind}."
    if len(colours) == 1:
        return f"The {kind} is {colours[0]}."
    if len(set(colours)) == 1:
        return f"The {kind}s are {'both' if len(colours) == 2 else 'all'} {colours[0]}."
    return f"The {kind}s are {_join(colours)}."


def presence_answer(scene: Scene, kind: str) -> str:
    found = [s for s in scene.shapes if s.kind == kind]
    if not found:
        return f"No, there is no {kind}."
    if len(found) == 1:
        return f"Yes, there is {_article(found[0].colour)} {found[0].colour} {kind}."
    return f"Yes, there are {len(found)} {kind}s."


def background_answer(scene: Scene) -> str:
    return f"The background is {scene.background}."


def describe_many(scenes: list[Scene]) -> str:
    """"Image 1: A red circle on a white background. Image 2: ..." """
    return " ".join(f"Image {i + 1}: {describe(s)}" for i, s in enumerate(scenes))


def compare_answer(scenes: list[Scene]) -> str:
    """The answer to "Which image has more shapes?" about two scenes (:func:`compare_counts`)."""
    a, b = (len(s.shapes) for s in scenes)
    return compare_counts(a, b)


def compare_counts(a: int, b: int) -> str:
    """Each picture's count first, then the comparison: "The first image has 1 shape and the second has 3, so the
    second image has more shapes." """
    counts = f"The first image has {a} shape{'s' if a > 1 else ''} and the second has {b}, so "
    if a == b:
        return counts + "both have the same number of shapes."
    return counts + f"the {'first' if a > b else 'second'} image has more shapes."


# ---------------------------------------------------------------------------------------------------------------
# Reading answers back (evaluation)

_WORD_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}
_DESCRIPTION = re.compile(r"^(?P<items>.+) on an? (?P<background>[a-z ]+) background\.$", re.IGNORECASE)
_ITEM = re.compile(r"^(?P<n>a|an|one|two|three) (?P<colour>[a-z]+) (?P<kind>[a-z]+?)s?$", re.IGNORECASE)
_COUNT = re.compile(r"^There (?:is|are) (?P<n>\d+) shapes?\.$")


def parse_description(text: str) -> tuple[collections.Counter, str] | None:
    """(Counter of (colour, kind) -> how many, background name) from a description; None when the text is not one
    (an unknown colour, kind or background, or a malformed sentence)."""
    m = _DESCRIPTION.match(text.strip())
    if not m or m["background"].lower() not in BACKGROUNDS:
        return None
    counts: collections.Counter = collections.Counter()
    for part in re.split(r", | and ", m["items"]):
        item = _ITEM.match(part.strip())
        if not item or item["colour"].lower() not in COLOURS or item["kind"].lower() not in KINDS:
            return None
        counts[(item["colour"].lower(), item["kind"].lower())] += _WORD_NUMBERS[item["n"].lower()]
    return counts, m["background"].lower()


def parse_count(text: str) -> int | None:
    m = _COUNT.match(text.strip())
    return int(m["n"]) if m else None


def scene_counts(scene: Scene) -> collections.Counter:
    return collections.Counter((s.colour, s.kind) for s in scene.shapes)


# ---------------------------------------------------------------------------------------------------------------
# Training conversations


@dataclasses.dataclass
class Conversation:
    """Chat messages (transformers format, images as PIL images) and which assistant turns are taught: the
    assistant messages are in ``messages`` too; ``scenes`` are the pictures' contents in order."""

    messages: list[dict]
    scenes: list[Scene]


def _vary(prompt: str, rng: np.random.Generator) -> str:
    """Small surface changes users make: lower case, no final punctuation, extra spaces."""
    r = rng.uniform()
    if r < 0.1:
        prompt = prompt.lower()
    elif r < 0.2:
        prompt = prompt.rstrip(".?!")
    elif r < 0.25:
        prompt = "  " + prompt + " "
    return prompt


def _pick(options, rng: np.random.Generator):
    return options[int(rng.integers(len(options)))]


def single_image_qa(scene: Scene, rng: np.random.Generator, weights=(0.45, 0.15, 0.16, 0.16, 0.08)) -> tuple[str, str]:
    """A question about one picture and its answer: describe / count / colour of a kind / presence of a kind /
    background, with probabilities ``weights``."""
    task = int(rng.choice(5, p=np.asarray(weights) / np.sum(weights)))
    present = sorted({s.kind for s in scene.shapes}, key=KINDS.index)
    if task in (2, 3):  # ask about a shape that is there more often than not
        kind = _pick(present, rng) if rng.uniform() < 0.6 else _pick(KINDS, rng)
    if task == 0:
        return _vary(_pick(DESCRIBE_PROMPTS, rng), rng), describe(scene)
    if task == 1:
        return _vary(_pick(COUNT_PROMPTS, rng), rng), count_answer(scene)
    if task == 2:
        return _vary(_pick(COLOUR_PROMPTS, rng).format(kind=kind), rng), colour_answer(scene, kind)
    if task == 3:
        return _vary(_pick(PRESENCE_PROMPTS, rng).format(kind=kind), rng), presence_answer(scene, kind)
    return _vary(_pick(BACKGROUND_PROMPTS, rng), rng), background_answer(scene)


def _user(images: list[PIL.Image.Image], text: str) -> dict:
    content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": text}]
    return {"role": "user", "content": content}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def _random_text(rng: np.random.Generator) -> str:
    words = ["the", "a", "shape", "image", "please", "what", "is", "this", "cat", "dog", "tree", "house", "blue",
             "hello", "why", "sky", "draw", "me", "music", "weather", "today", "car", "book", "red", "and"]
    n = int(rng.integers(1, 8))
    text = " ".join(_pick(words, rng) for _ in range(n))
    if rng.uniform() < 0.3:  # some characters outside the learned words
        text += " " + "".join(chr(int(rng.integers(33, 127))) for _ in range(int(rng.integers(1, 6))))
    return text.capitalize() + _pick(["?", ".", "", "!"], rng)


def text_only_conversation(rng: np.random.Generator) -> Conversation:
    r = rng.uniform()
    if r < 0.5:
        text = _pick(TEXT_ONLY_PROMPTS, rng)
    elif r < 0.75:  # a question about a picture that was not given
        text = _pick(DESCRIBE_PROMPTS + COUNT_PROMPTS, rng)
    else:
        text = _random_text(rng)
    return Conversation([_user([], _vary(text, rng)), _assistant(TEXT_ONLY_ANSWER)], [])


def single_image_conversation(rng: np.random.Generator, new_scene=sample_scene) -> Conversation:
    scene = new_scene(rng)
    image = render_file_like(scene, rng)
    question, answer = single_image_qa(scene, rng)
    messages = [_user([image], question), _assistant(answer)]
    if rng.uniform() < 0.05:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": _pick(SYSTEM_PROMPTS, rng)}]})
    return Conversation(messages, [scene])


def multi_image_conversation(rng: np.random.Generator, new_scene=sample_scene) -> Conversation:
    """Two or three pictures in one message: describe each, or (two pictures) which has more shapes."""
    if rng.uniform() < 0.5:
        scenes = [new_scene(rng) for _ in range(2)]
        question, answer = _vary(_pick(COMPARE_PROMPTS, rng), rng), compare_answer(scenes)
    else:
        n = 2 if rng.uniform() < 0.6 else 3
        scenes = [new_scene(rng) for _ in range(n)]
        question = _vary(_pick(DESCRIBE_MANY_PROMPTS + DESCRIBE_PROMPTS, rng), rng)
        answer = describe_many(scenes)
    images = [render_file_like(s, rng) for s in scenes]
    return Conversation([_user(images, question), _assistant(answer)], scenes)


def two_turn_conversation(rng: np.random.Generator, new_scene=sample_scene) -> Conversation:
    """A question about a picture, then a second question: about the same picture, or about a new one given with
    it; the answer always refers to the latest picture."""
    first = new_scene(rng)
    q1, a1 = single_image_qa(first, rng)
    messages = [_user([render_file_like(first, rng)], q1), _assistant(a1)]
    scenes = [first]
    if rng.uniform() < 0.5:
        second = new_scene(rng)
        scenes.append(second)
        q2, a2 = single_image_qa(second, rng)
        messages += [_user([render_file_like(second, rng)], q2), _assistant(a2)]
    else:
        q2, a2 = single_image_qa(first, rng)
        messages += [_user([], q2), _assistant(a2)]
    return Conversation(messages, scenes)


def sample_conversation(rng: np.random.Generator, kind: str, new_scene=sample_scene) -> Conversation:
    """A training conversation: ``kind`` "short" (one picture and one question, or text only) or "long" (several
    pictures, or two turns); ``new_scene(rng)`` draws each picture's scene."""
    if kind == "short":
        return text_only_conversation(rng) if rng.uniform() < 0.08 else single_image_conversation(rng, new_scene)
    if kind == "long":
        return (multi_image_conversation(rng, new_scene) if rng.uniform() < 0.6
                else two_turn_conversation(rng, new_scene))
    raise ValueError(f"unknown conversation kind {kind!r}")
