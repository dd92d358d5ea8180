"""Command line of the Python API: ``omnijax generate`` and ``omnijax score`` (also ``python -m app ...``).

The shared model and sampling flags live here (``add_model_flags`` / ``load_pipeline``: every command that loads a
model takes them, and they are checked here before anything loads); the ``omnijax`` program (demo/cli.py) adds the
``caption``, ``demo`` and other commands of demo/ to the same parser."""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import tempfile
import time

from omnijax.common.errors import CheckpointError, OmnijaxError, PromptError
from omnijax.preprocess.video_size import VIDEO_SIZES

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZE_CHOICES = ("none", "int8", "int4")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local Hugging Face checkpoint folder, or a .gguf file (default: the embedded "
                                   "default model)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="dtype of the weights that are not quantized (default float32)")
    p.add_argument("--quantize", default="none", choices=list(QUANTIZE_CHOICES),
                   help="store the decoder's weight matrices as int8 (per output channel) or int4 (groups of 32); "
                        "default none")
    p.add_argument("--model-axis", type=int, default=None, help="devices that shard the weights (default: all)")
    p.add_argument("--video-size", default="processor", choices=list(VIDEO_SIZES),
                   help="frame size bounds of videos where the processor overrides the checkpoint's saved video size "
                        "(Qwen3-Omni): the processor's default, as transformers resizes them (default), or the "
                        "checkpoint's own")
    p.add_argument("--no-compilation-cache", action="store_true",
                   help="do not keep compiled programs in $OMNIJAX_HOME/jax-cache for the next run")


def add_engine_flags(p: argparse.ArgumentParser, *, max_batch: bool = True) -> None:
    """The serving engine's budgets (demo, serve)."""
    if max_batch:
        p.add_argument("--max-batch", type=int, default=32,
                       help="requests decoded together (slots; default 32; their keys and values share --kv-cache-mb)")
    p.add_argument("--max-batched-tokens", type=int, default=512,
                   help="prompt tokens one engine step runs beside the decoding requests, shared by up to four "
                        "prompts (default 512)")
    p.add_argument("--max-context", type=int, default=None,
                   help="prompt plus answer tokens one request may hold (default: the model's limit, at most 8192)")
    p.add_argument("--kv-cache-mb", type=float, default=1024,
                   help="memory for the keys / values of the requests in the engine (the layers that keep the whole "
                        "context; each request holds what its prompt and max tokens need, and one that does not fit "
                        "waits; default 1024)")
    p.add_argument("--prefix-cache-mb", type=float, default=256,
                   help="memory for keys / values of earlier prompts reused by later ones (0: off; default 256)")
    p.add_argument("--media-cache-mb", type=float, default=256,
                   help="memory for encoded images / audio reused by later prompts (0: off; default 256)")


def add_generate_parser(sub) -> argparse.ArgumentParser:
    gen = sub.add_parser("generate", help="answer one prompt with optional images, audio and videos")
    add_model_flags(gen)
    gen.add_argument("--prompt", required=True, help="the user's text")
    gen.add_argument("--image", action="append", default=[], help="an image file (repeatable)")
    gen.add_argument("--audio", action="append", default=[], help="an audio file (repeatable)")
    gen.add_argument("--video", action="append", default=[],
                     help="a video file (repeatable), sampled as the checkpoint's video processor says, with its "
                          "sound track where the model takes audio")
    gen.add_argument("--system", help="an optional system message")
    gen.add_argument("--raw", action="store_true",
                     help="continue --prompt as plain text (base models): no chat template, text only")
    gen.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    gen.add_argument("--response-format", metavar="JSON",
                     help="a structured output, as OpenAI's response_format (or @FILE holding it): e.g. "
                          "'{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {...}}}', "
                          "'{\"type\": \"json_object\"}', '{\"type\": \"regex\", \"regex\": \"...\"}', "
                          "'{\"type\": \"choice\", \"choice\": [\"yes\", \"no\"]}', "
                          "'{\"type\": \"grammar\", \"grammar\": \"<Lark>\"}'")
    gen.add_argument("--tools", metavar="JSON",
                     help="functions the model may call, as OpenAI's tools list (or @FILE holding it); the answer's "
                          "text is printed, then each call as a line of JSON ({\"name\": ..., \"arguments\": {...}})")
    gen.add_argument("--tool-choice", default=None,
                     help="with --tools: auto (the default), none, required, or a function's name (that one call)")
    gen.add_argument("--no-stream", action="store_true", help="print the answer at the end instead of streaming")
    gen.add_argument("--speak", metavar="FILE.wav", help="also answer aloud (a model with a talker): write the spoken "
                                                       "answer to this WAV file (the text still goes to stdout)")
    gen.add_argument("--voice", help="the voice of --speak (one of the checkpoint's speakers; default its first)")
    gen.add_argument("--max-speech-frames", type=int, default=None,
                     help="a cap on the codec frames spoken (Qwen3-Omni: 12.5 per second; default 4096)")
    add_sampling_flags(gen)
    return gen


def add_score_parser(sub) -> argparse.ArgumentParser:
    score = sub.add_parser("score", help="perplexity of text files under the model (raw text, no chat template)")
    add_model_flags(score)
    score.add_argument("files", nargs="+", metavar="FILE", help="a UTF-8 text file (repeatable)")
    return score


def read_text_file(path: str) -> str:
    """The UTF-8 text of ``path`` (a regular file of at most 16 MiB: what ``score`` takes), else PromptError
    naming the problem."""
    from omnijax.preprocess.request_limits import MAX_SCORE_TEXT_BYTES

    file = pathlib.Path(path).expanduser()
    try:
        if not file.is_file():
            raise PromptError(f"{path!r} is not a readable file")
        if file.stat().st_size > MAX_SCORE_TEXT_BYTES:
            raise PromptError(f"{path!r} is over {MAX_SCORE_TEXT_BYTES >> 20} MiB")
        return file.read_bytes().decode("utf-8")
    except OSError as e:
        raise PromptError(f"{path!r} cannot be read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise PromptError(f"{path!r} is not UTF-8 text: {e}") from e


def response_format_of(value: str | None):
    """``--response-format`` (JSON text, or @FILE holding it) as a checked Constraint (None without one);
    ConstraintError naming the flag otherwise."""
    if value is None:
        return None
    import json

    from omnijax.app.grammar import from_response_format
    from omnijax.common.errors import ConstraintError

    text = read_text_file(value[1:]) if value.startswith("@") else value
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConstraintError(f"--response-format is not valid JSON: {e}") from None
    return from_response_format(parsed, where="--response-format")


def tools_of(args) -> dict | None:
    """``--tools`` (JSON text, or @FILE holding it) and ``--tool-choice``, checked (ToolError naming the flag's
    field), as ``Pipeline.generate``'s settings; None without tools."""
    if args.tools is None:
        if args.tool_choice is not None:
            raise PromptError("--tool-choice needs --tools")
        return None
    import json

    from omnijax.app.tool_calls import tool_request
    from omnijax.app.tools import ToolError

    if getattr(args, "raw", False):
        raise PromptError("--tools needs a chat prompt, not --raw")
    text = read_text_file(args.tools[1:]) if args.tools.startswith("@") else args.tools
    try:
        tools = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ToolError(f"not valid JSON: {e}", "--tools") from None
    choice = args.tool_choice
    if choice not in (None, "auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    try:
        tool_request(tools, choice, True)
    except ToolError as e:
        raise ToolError(str(e).split(": ", 1)[-1], "--" + e.param.replace("tool_choice", "tool-choice")) from None
    return {"tools": tools, "tool_choice": choice}


def print_tool_answer(result) -> None:
    """An answer with tools: its text (before the calls), then each call as one line of JSON."""
    import json

    if result.tool_calls is None:
        print(result.text)
        return
    if result.content:
        print(result.content)
    for call in result.tool_calls:
        print(json.dumps({"name": call.name, "arguments": json.loads(call.arguments)}, ensure_ascii=False))


def run_score(args) -> int:
    """One line per file (perplexity, tokens scored, mean log-probability), then the total over every file."""
    import math

    texts = [read_text_file(f) for f in args.files]  # unreadable files fail before the model loads
    model_settings(args)
    pipe = load_pipeline(args)
    from omnijax.app.scoring import perplexity

    results = []
    for name, text in zip(args.files, texts):
        logprobs = pipe.score(text)
        results.append(logprobs)
        mean = float(logprobs.mean()) if len(logprobs) else math.nan
        print(f"{name}: perplexity {perplexity([logprobs]):.4f} over {len(logprobs)} tokens "
              f"(mean log-probability {mean:.4f})")
    if len(results) > 1:
        print(f"total: perplexity {perplexity(results):.4f} over {sum(len(r) for r in results)} tokens")
    return 0


COMMANDS = {"generate": (add_generate_parser, lambda args: run_generate(args)),
            "score": (add_score_parser, lambda args: run_score(args))}


def parser(commands: dict | None = None) -> argparse.ArgumentParser:
    """The ``omnijax`` parser with ``commands`` (name -> (add_parser(subparsers), run(args))) as subcommands."""
    top = argparse.ArgumentParser(prog="omnijax", description="Multimodal generation on JAX")
    sub = top.add_subparsers(dest="command", required=True)
    for add, _ in (commands or COMMANDS).values():
        add(sub)
    return top


def load_pipeline(args, **overrides):
    """The Pipeline the command's flags ask for (``overrides``: more ``Pipeline.from_pretrained`` arguments)."""
    from omnijax.app.pipeline import Pipeline

    if getattr(args, "no_compilation_cache", False):
        os.environ["OMNIJAX_COMPILATION_CACHE"] = "0"

    folder = args.model
    if folder is None:
        from omnijax.app.default_model import default_model_dir

        folder = default_model_dir()
        print(f"[omnijax] no --model given: using the embedded default model at {folder} (a small model "
              f"trained on pictures of simple shapes)", file=sys.stderr)
    names = ("max_batch", "max_batched_tokens", "max_context", "prefix_cache_mb", "media_cache_mb", "kv_cache_mb")
    engine = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return Pipeline.from_pretrained(folder, **model_settings(args), model_axis=args.model_axis,
                                    **(engine | overrides))


def model_settings(args) -> dict:
    """``dtype`` and ``quantize`` of ``Pipeline.from_pretrained`` from the model flags, checked (SettingError naming
    the valid values: a caller that built ``args`` without argparse's choices gets the same message)."""
    from omnijax.common.errors import SettingError

    dtype = getattr(args, "dtype", "float32")
    quantize = getattr(args, "quantize", "none") or "none"
    if dtype not in DTYPES:
        raise SettingError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if quantize not in QUANTIZE_CHOICES:
        raise SettingError(f"--quantize {quantize!r} is not one of {', '.join(QUANTIZE_CHOICES)}")
    video_size = getattr(args, "video_size", "processor")
    if video_size not in VIDEO_SIZES:
        raise SettingError(f"--video-size {video_size!r} is not one of {', '.join(VIDEO_SIZES)}")
    return {"dtype": dtype, "quantize": None if quantize == "none" else quantize, "video_size": video_size}


def messages_from(args) -> list[dict] | str:
    """The chat messages of ``--prompt`` (with ``--image`` / ``--audio`` / ``--video`` / ``--system``), or with
    ``--raw`` the prompt string itself."""
    videos = getattr(args, "video", None) or []
    if getattr(args, "raw", False):
        extras = [flag for flag, value in (("--image", args.image), ("--audio", args.audio), ("--video", videos),
                                           ("--system", args.system)) if value]
        if extras:
            raise PromptError(f"--raw continues plain text and takes no {', '.join(extras)}")
        return args.prompt
    content = [{"type": "image", "image": path} for path in args.image]
    content += [{"type": "audio", "audio": path} for path in args.audio]
    content += [{"type": "video", "video": path} for path in videos]
    content.append({"type": "text", "text": args.prompt})
    messages = [{"role": "system", "content": [{"type": "text", "text": args.system}]}] if args.system else []
    return messages + [{"role": "user", "content": content}]


def check_media_paths(args) -> None:
    """Every ``--image`` / ``--audio`` / ``--video`` file exists and is a readable regular file, and ``--model`` (when given)
    exists: checked before anything loads."""
    from omnijax.preprocess.sources import check_media_file

    for flag in ("image", "audio", "video"):
        for path in getattr(args, flag, None) or ():
            check_media_file(path, flag)
    if getattr(args, "model", None) is not None and not pathlib.Path(args.model).expanduser().exists():
        raise CheckpointError(f"--model {args.model!r} does not exist")
    check_speak_path(args)


def check_speak_path(args) -> None:
    """``--speak`` names a file in an existing folder (not a folder), and speech flags come with --speak."""
    if getattr(args, "speak", None) is None:
        for flag, value in (("--voice", getattr(args, "voice", None)),
                            ("--max-speech-frames", getattr(args, "max_speech_frames", None))):
            if value is not None:
                raise PromptError(f"{flag} needs --speak FILE.wav")
        return
    out = pathlib.Path(args.speak).expanduser()
    if out.is_dir():
        raise PromptError(f"--speak {args.speak!r} is a folder; name the WAV file to write")
    if not out.parent.is_dir():
        raise PromptError(f"--speak {args.speak!r}: the folder {str(out.parent)!r} does not exist")
    if out.exists() and not out.is_file():  # a device, a FIFO, a socket: never replaced by a file
        raise PromptError(f"--speak {args.speak!r} is not a regular file (a device or a pipe?); name a WAV file")
    inputs = [(f"--{flag}", path) for flag in ("image", "audio", "video") for path in getattr(args, flag, None) or ()]
    for flag, path in inputs + [("--model", getattr(args, "model", None))]:
        if path is not None and out.exists() and pathlib.Path(path).expanduser().exists() \
                and os.path.samefile(out, pathlib.Path(path).expanduser()):
            raise PromptError(f"--speak {args.speak!r} is also the {flag} input; name another file")
    try:  # the folder takes a new file (the answer is written beside, then renamed)
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PromptError(f"--speak {args.speak!r}: cannot write in the folder {str(out.parent)!r}: "
                          f"{exc.strerror or exc}") from None
    if getattr(args, "raw", False):
        raise PromptError("--raw continues plain text; --speak needs a chat prompt")
    from omnijax.app.sampling import check_max_speech_frames

    check_max_speech_frames(args.max_speech_frames, "--max-speech-frames")


def run_generate(args) -> int:
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, stop=args.stop)
    messages = messages_from(args)
    check_media_paths(args)  # a media file that cannot be read fails before the model loads (and JAX) ...
    from omnijax.app.sampling import check_settings

    check_settings(**sampling)  # ... and so does a bad setting
    sampling["response_format"] = response_format_of(args.response_format)
    tools = tools_of(args)
    model_settings(args)
    pipe = load_pipeline(args, max_batch=1)
    from omnijax.app import program_clock

    clock = program_clock.start()
    start = time.perf_counter()
    if args.speak is not None:
        sampling.update(speak=True, voice=args.voice, max_speech_frames=args.max_speech_frames)
    if tools is not None:  # the calls are read from the whole answer
        result = pipe.generate(messages, **sampling, **tools)
        print_tool_answer(result)
    elif args.no_stream:
        result = pipe.generate(messages, **sampling)
        print(result.text)
    else:
        pieces = pipe.stream(messages, **sampling)
        while True:
            try:
                piece = next(pieces)
            except StopIteration as done:
                result = done.value
                break
            text = piece if isinstance(piece, str) else getattr(piece, "text", None)
            if text is not None:
                print(text, end="", flush=True)
        print()
    print(f"[omnijax] {timing_line(result, time.perf_counter() - start, clock.since())}", file=sys.stderr)
    if args.speak is not None:
        write_spoken(pathlib.Path(args.speak).expanduser(), result)
    return 0


def write_spoken(path: pathlib.Path, result) -> None:
    """The spoken answer of ``result`` as a WAV file at ``path`` (replaced whole or left as it was); a failure to
    write (a full disk) is an OmnijaxError naming the file, after the text answer has been printed."""
    from omnijax.app.wav import write_wav

    try:
        write_wav(path, result.audio, result.sample_rate)
    except OSError as exc:
        raise OmnijaxError(f"cannot write the spoken answer to {str(path)!r}: {exc.strerror or exc} (the text "
                           f"answer is above)") from None
    print(f"[omnijax] wrote {path} ({len(result.audio) / result.sample_rate:.2f} s of speech, "
          f"{len(result.audio_codes)} codec frames)", file=sys.stderr)


def timing_line(result, seconds: float, preparation=None) -> str:
    """``12 new tokens in 0.84 s (14.3 tokens/s, prompt 51 tokens, ended by eos)``, then, when programs were
    prepared meanwhile (``preparation``: app/program_clock.py), ``, after 5.10 s preparing 23 programs
    (compiled: ...)``: that time is not counted in the generation's seconds and tokens/s."""
    n = len(result.token_ids)
    prepared = preparation is not None and preparation.programs > 0
    if prepared:
        seconds = max(seconds - preparation.seconds, 0.0)
    rate = f"{n / seconds:.1f} tokens/s, " if seconds > 0 else ""
    line = (f"{n} new token{'s' * (n != 1)} in {seconds:.2f} s ({rate}prompt {result.prompt_tokens} tokens, "
            f"ended by {result.finish_reason})")
    return f"{line}, after {preparation.describe()}" if prepared else line


def main(argv=None, commands: dict | None = None) -> int:
    """Run one command; OmnijaxError -> one line and exit 2, Ctrl-C -> exit 130."""
    logging.basicConfig(level=logging.WARNING, format="[omnijax] %(message)s")
    commands = commands or COMMANDS
    args = parser(commands).parse_args(argv)
    try:
        return commands[args.command][1](args)
    except OmnijaxError as e:
        print(f"omnijax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("omnijax: interrupted", file=sys.stderr)
        return 130
