"""The gradio web demo: a multimodal chat with any loaded ``Pipeline`` (``omnijax demo``).

A ``gr.ChatInterface`` with a ``gr.MultimodalTextbox`` (images, audio files / microphone and video files, each when
the model takes it), answers streamed piece by piece, gradio's Stop button (it closes the generator, which cancels
the request and frees its slot at the engine's next step), sampling controls, and one stats line per answer. Every
browser tab's request goes to the pipeline's serving engine, so several tabs generate at the same time (the
engine's slots decode them together; a request beyond its slots waits for one). A bad file or a failed
generation becomes an error message in the chat; the server keeps serving. The page names the inputs the model
takes and offers attachments only for those (none for a text-only model); a model without a chat template (a base
model) continues each message as plain text. A model with a talker gets a "Speak the answer" switch and a voice
choice: the spoken answer plays on the page as its chunks arrive (a small Web Audio player fed through
``speech_update`` values, which needs no ffmpeg on the server), then stays under the chat as a replayable file.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

import gradio as gr
import numpy as np

from omnijax.app.speech_events import AudioChunk
from omnijax.common.errors import OmnijaxError, PromptError
from omnijax.common.interruptible import wait_event
from omnijax.demo.body_limit import BodyLimit
from omnijax.demo.host_check import HostCheck, allowed_names
from omnijax.demo.interrupts import terminate_as_interrupt
from omnijax.preprocess.request_limits import MAX_TEXT_BYTES, check_text_size
from omnijax.demo.chat_state import (
    AUDIO_EXTENSIONS,
    DEFAULT_MAX_UPLOAD_MB,
    IMAGE_EXTENSIONS,
    MEDIA_KINDS,
    VIDEO_EXTENSIONS,
    AnswerStats,
    answer_message,
    build_messages,
    error_message,
    format_stats,
    model_header,
    sampling_options,
    speech_update,
    validate_upload,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 256
EXAMPLES_DIR = pathlib.Path(__file__).resolve().parents[1] / "examples"
DEFAULT_MODEL_NOTICE = ("This is the embedded default model: a small model trained only on pictures of simple shapes "
                        "(circles, squares and triangles in six colours). Ask it to describe a picture, count the "
                        "shapes or name a shape's colour; try the examples below. Start with `--model DIR` for a "
                        "real checkpoint.")
# The largest request body besides uploads (the message, the chat history and the settings, as JSON): text is
# capped at MAX_TEXT_BYTES per request, and JSON escapes at most a few bytes per character.
MAX_BODY_BYTES = 8 * MAX_TEXT_BYTES
UPLOAD_PATH = "/gradio_api/upload"  # streams to disk under gradio's own cap (--max-upload-mb)
COMPLETION_NOTICE = ("This checkpoint has no chat template (a base model): each message is continued as plain "
                     "text, without the earlier turns.")


# The speech player: a Web Audio queue fed by the values of ``speech_update`` (each chunk played once, in order,
# right after the one before); a new answer number starts a new queue.
SPEECH_PLAYER_JS = """
const state = {context: null, next: 0, answer: null, last: -1, played: 0};
const label = element.querySelector('.speech-state');
watch('value', () => {
  let update;
  try { update = JSON.parse(props.value || 'null'); } catch (error) { return; }
  if (!update || !update.chunks) return;
  if (update.answer !== state.answer) {
    if (state.context) state.context.close();
    Object.assign(state, {context: null, next: 0, answer: update.answer, last: -1, played: 0});
  }
  for (const chunk of update.chunks) {
    if (chunk.seq <= state.last) continue;
    state.last = chunk.seq;
    if (!state.context) {
      state.context = new AudioContext({sampleRate: update.rate});
      state.next = state.context.currentTime + 0.05;
    }
    const bytes = Uint8Array.from(atob(chunk.pcm), c => c.charCodeAt(0));
    const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
    const buffer = state.context.createBuffer(1, Math.max(pcm.length, 1), update.rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
    const source = state.context.createBufferSource();
    source.buffer = buffer;
    source.connect(state.context.destination);
    const at = Math.max(state.next, state.context.currentTime);
    source.start(at);
    state.next = at + buffer.duration;
    state.played += pcm.length;
  }
  element.dataset.chunks = String(state.last + 1);
  element.dataset.samples = String(state.played);
  label.textContent = 'speaking';
});
"""


def accepted_media(pipe) -> tuple[str, ...]:
    """The media kinds ("image", "audio", "video") the pipeline's model takes, from ``pipe.config.modalities``."""
    return tuple(kind for kind in MEDIA_KINDS if kind in pipe.config.modalities)


def completion_mode(pipe) -> bool:
    """True for a model without a chat template (a base model): the demo continues each message as raw text."""
    return not getattr(pipe, "has_chat_template", True)


def speaks(pipe) -> bool:
    """Whether the pipeline's model can answer aloud."""
    return bool(getattr(pipe, "has_talker", False))


def _stream_into(pipe, messages: list[dict] | str, options: dict, sink: dict) -> Iterator[Any]:
    """``pipe.stream``'s events (text pieces, and audio chunks of a spoken answer); its return value (a
    GenerationResult, when the pipeline gives one) lands in ``sink["result"]``."""
    sink["result"] = yield from pipe.stream(messages, **options)


def _file_path(file: Any) -> str:
    return file.get("path") if isinstance(file, dict) else str(file)


def _media_paths(messages: list[dict]) -> list[str]:
    """The paths of every media part of pipeline ``messages``."""
    return [str(part[part["type"]]) for m in messages for part in m["content"] if part["type"] in MEDIA_KINDS]


def _report(error: Exception, paths: list[str]) -> dict:
    """The chat message for a failed request: an OmnijaxError's own text; anything else is also logged."""
    if isinstance(error, OmnijaxError):
        return error_message(error, paths)
    log.error("request failed", exc_info=error)
    return error_message(f"request failed: {type(error).__name__}: {error}", paths)


def make_responder(pipe, *, max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
                   max_speech_frames: int | None = None) -> Callable[..., Iterator[tuple]]:
    """The chat function: ``respond(message, history, max_new_tokens, temperature, top_p, top_k, seed)``, plus
    ``speak, voice`` for a model with a talker.

    message: the MultimodalTextbox value ``{"text": str, "files": [path, ...]}``; history: the Chatbot's messages
    (left out for a model without a chat template: its message text is continued as a raw prompt). Yields
    ``(assistant message, stats markdown)`` pairs: the answer so far while streaming (stats left as they are),
    then the whole answer with its stats line; or one error message. For a model with a talker each output also
    holds the speech player's value (``speech_update``, per audio chunk) and the whole spoken answer
    ((sample rate, int16 samples), at the end; None when not spoken). max_speech_frames: a cap on the codec frames
    of a spoken answer (default the pipeline's).
    """
    media_kinds = accepted_media(pipe)
    raw = completion_mode(pipe)
    talker = speaks(pipe)
    max_bytes = int(max_upload_mb * 2**20)
    text_limit = getattr(getattr(getattr(pipe, "processor", None), "budget", None), "max_text_bytes", MAX_TEXT_BYTES)
    answers = itertools.count(1)  # the speech player's answer numbers

    keep = object()  # an output left as it is

    def out(message, stats, player=keep, audio=keep):
        """One output tuple (with the speech player and the spoken answer for a model with a talker)."""
        if not talker:
            return message, stats
        return message, stats, gr.skip() if player is keep else player, gr.skip() if audio is keep else audio

    def respond(message, history, max_new_tokens, temperature, top_p, top_k, seed, speak=False, voice=None):
        message = message or {}
        paths = [_file_path(f) for f in message.get("files") or []]
        try:
            check_text_size([message.get("text") or ""], text_limit, "the message")  # before anything is built
            media = [(validate_upload(p, max_bytes=max_bytes, modalities=media_kinds), p) for p in paths]
            if raw:
                messages = message.get("text") or ""
                if not messages.strip():
                    raise PromptError("the message is empty: type some text to continue")
            else:
                messages = build_messages(history or [], message.get("text") or "", media)
            options = sampling_options(max_new_tokens, temperature, top_p, top_k, seed)
            if talker and speak:
                options.update(speak=True, voice=voice or None, max_speech_frames=max_speech_frames)
        except Exception as e:  # noqa: BLE001 - a bad request must not stop the server
            yield out(_report(e, paths), "")
            return
        answer, sink, first, first_audio, chunks = "", {}, None, None, []
        number = next(answers)
        try:
            start = time.perf_counter()
            # closed when the generator finishes or is closed (Stop closes it): the request is cancelled
            with contextlib.closing(_stream_into(pipe, messages, options, sink)) as pieces:
                for piece in pieces:
                    if isinstance(piece, AudioChunk):
                        chunks.append(piece.samples)
                        first_audio = first_audio or time.perf_counter() - start
                        yield out(answer_message(answer), gr.skip(),
                                  speech_update(number, chunks, piece.sample_rate))
                        continue
                    answer += getattr(piece, "text", piece)
                    if first is None:
                        first = time.perf_counter() - start
                        # clears the previous answer's stats and spoken answer
                        yield out(answer_message(answer), "", audio=None)
                    else:
                        yield out(answer_message(answer), gr.skip())
            total = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - a failed generation must not stop the server
            report = _report(e, [] if raw else _media_paths(messages))
            yield out([answer_message(answer), report] if answer else report, "")
            return
        result = sink.get("result")
        if result is not None:  # the final text can differ from the pieces: later bytes can change how a run decodes
            answer = result.text
        spoken = getattr(result, "audio", None)
        stats = AnswerStats(prompt_tokens=getattr(result, "prompt_tokens", None),
                            generated_tokens=len(result.token_ids) if result is not None else None,
                            first_token_s=first, total_s=total, first_audio_s=first_audio,
                            audio_s=None if spoken is None else len(spoken) / result.sample_rate)
        whole = None if spoken is None or not len(spoken) else \
            (result.sample_rate, np.round(np.clip(spoken, -1, 1) * 32767).astype(np.int16))
        yield out(answer_message(answer), format_stats(stats), audio=whole)

    return respond


def _settings(pipe) -> list[gr.components.Component]:
    """Max new tokens, temperature, top-p, top-k and seed controls, and for a model with a talker the speak switch
    and the voice (rendered where they are created)."""
    most = max(1, min(int(pipe.config.max_context), 8192))
    controls = [
        gr.Slider(1, most, value=min(DEFAULT_MAX_NEW_TOKENS, most), step=1, label="Max new tokens"),
        gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature", info="0 = greedy"),
        gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="Top-p", info="1 = off"),
        gr.Slider(0, 200, value=0, step=1, label="Top-k", info="0 = off"),
        gr.Number(value=0, precision=0, minimum=0, label="Seed"),
    ]
    if speaks(pipe):
        controls += [gr.Checkbox(value=False, label="Speak the answer", elem_id="speak",
                                 info="the talker reads the answer aloud once it is written"),
                     gr.Dropdown(list(pipe.voices), value=pipe.voices[0], label="Voice", elem_id="voice")]
    return controls


def build_demo(pipe, *, max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB, notice: str | None = None,
               examples: list[dict] | None = None, max_speech_frames: int | None = None) -> gr.Blocks:
    """The demo page for ``pipe``: model header, chat, the last answer's stats, generation settings (sidebar).

    examples: example messages ``{"text": prompt, "files": [image path, ...]}`` shown under the chat (a click puts
    one in the message box, with the default settings). max_speech_frames: a cap on a spoken answer's codec frames
    (default the pipeline's). Launch it with ``launch`` (which sets up the queue and the upload
    size cap).
    """
    kinds = accepted_media(pipe)
    if completion_mode(pipe):
        notice = "\n\n".join(n for n in (notice, COMPLETION_NOTICE) if n)
    by_kind = {"image": IMAGE_EXTENSIONS, "audio": AUDIO_EXTENSIONS, "video": VIDEO_EXTENSIONS}
    extensions = sorted(ext for kind in kinds for ext in by_kind[kind])
    attach = " or ".join(f"{k}s" for k in kinds)
    sources = (["upload"] if kinds else []) + (["microphone"] if "audio" in kinds else [])
    textbox = gr.MultimodalTextbox(
        file_types=extensions or None, file_count="multiple", sources=sources,
        placeholder=("Type text to continue…" if completion_mode(pipe) else
                     "Type a message" + (f", attach or paste {attach}…" if kinds else "…")),
        autofocus=True, submit_btn=True, stop_btn=True, elem_id="chat-input", show_label=False,
    )
    chatbot = gr.Chatbot(label=f"{pipe.name} ({pipe.family})", elem_id="chatbot", scale=1, height=520,
                         buttons=["copy", "copy_all"], feedback_options=None, group_consecutive_messages=False)
    with gr.Blocks(title=f"omnijax · {pipe.name}", analytics_enabled=False, fill_height=True) as demo:
        with gr.Sidebar(label="Generation settings", position="right", open=True, elem_id="settings"):
            gr.Markdown("### Generation settings")
            settings = _settings(pipe)
        defaults = [component.value for component in settings]
        gr.Markdown(f"## omnijax chat\n{model_header(pipe.name, pipe.family, kinds, notice)}",
                    elem_id="model-info")
        stats = gr.Markdown("", elem_id="answer-stats", render=False)
        outputs = [stats]
        if speaks(pipe):
            outputs += [gr.HTML("", html_template="<div class='speech-player'><span class='speech-state'></span></div>",
                                js_on_load=SPEECH_PLAYER_JS, elem_id="speech-player", render=False),
                        gr.Audio(label="Spoken answer", type="numpy", format="wav", interactive=False,
                                 elem_id="spoken-answer", render=False)]
        gr.ChatInterface(
            make_responder(pipe, max_upload_mb=max_upload_mb, max_speech_frames=max_speech_frames),
            multimodal=True, chatbot=chatbot, textbox=textbox, additional_inputs=settings,
            additional_outputs=outputs, concurrency_limit=None, api_name="chat", analytics_enabled=False,
            fill_height=True,
        )
        for output in outputs:
            output.render()  # right under the message box, above the examples: in view with the chat
        if examples:
            gr.Examples([[example, *defaults] for example in examples], inputs=[textbox, *settings],
                        label="Examples", cache_examples=False, elem_id="examples")
        chatbot.clear(lambda: "", None, stats, queue=False, api_visibility="private")
    return demo


def launch(demo: gr.Blocks, *, host: str = "127.0.0.1", port: int = 7860,
           max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB, block: bool = True, quiet: bool = False,
           allow_hosts: tuple[str, ...] = ()):
    """Serve ``demo`` on ``host:port``: requests run side by side on the pipeline's engine (gradio's queue holds
    at most 64 waiting events), uploads capped at ``max_upload_mb``, other request bodies at MAX_BODY_BYTES, only
    for requests addressed to its own names (demo/host_check.py: ``host`` when it is a name, ``allow_hosts``,
    addresses and localhost).

    block=False returns once the server is up (call ``demo.close()`` to stop it). A port in use or an address
    that cannot be listened on raises ServeError naming the --port / --host flag.
    """
    from starlette.middleware import Middleware

    from omnijax.demo.cli_web import listen_problem

    demo.queue(default_concurrency_limit=None, max_size=64)
    guards = [Middleware(HostCheck, names=allowed_names(host, allow_hosts)),
              Middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, exempt=(UPLOAD_PATH,))]
    try:
        return demo.launch(server_name=host, server_port=port, max_file_size=int(max_upload_mb * 2**20),
                           share=False, inbrowser=False, show_error=True, ssr_mode=False, pwa=False,
                           mcp_server=False, prevent_thread_lock=not block, quiet=quiet,
                           app_kwargs={"middleware": guards})
    except OSError as e:
        raise listen_problem(host, port, e) from None


def stop(demo: gr.Blocks) -> None:
    """Stop a demo started by ``serve`` and remove the uploads it received."""
    with contextlib.redirect_stdout(io.StringIO()):  # gradio announces the port it closes
        demo.close()
    folder = getattr(demo, "omnijax_upload_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("GRADIO_TEMP_DIR") == folder:
            previous = demo.omnijax_previous_temp_dir
            if previous is None:
                del os.environ["GRADIO_TEMP_DIR"]
            else:
                os.environ["GRADIO_TEMP_DIR"] = previous


def default_model_examples(folder: pathlib.Path = EXAMPLES_DIR) -> list[dict]:
    """The embedded default model's example messages from ``folder``/examples.json (pictures and a prompt each;
    written by scripts/make_examples.py), as ``{"text", "files"}`` dicts; none when the folder is not there (an
    installation without the repository's examples/)."""
    try:
        manifest = json.loads((folder / "examples.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    examples = []
    for entry in manifest.get("examples", []):
        files = [str(folder / name) for name in entry["files"]]
        if all(os.path.isfile(f) for f in files):
            examples.append({"text": entry["prompt"], "files": files})
    return examples


def serve(args, *, block: bool = True) -> gr.Blocks:
    """``omnijax demo``: load ``args.model`` (default: the embedded default model, with its examples) and serve the chat on
    ``args.host:args.port`` until Ctrl-C. Returns the demo (after the server stops, or at once with block=False:
    then ``stop(demo)`` ends it).

    Uploads are kept in a folder of this run (GRADIO_TEMP_DIR, set for this process), removed when it stops, on
    Ctrl-C and on SIGTERM alike.
    """
    with terminate_as_interrupt():
        return _serve(args, block)


def _serve(args, block: bool) -> gr.Blocks:
    from omnijax.app.cli import load_pipeline

    pipe = load_pipeline(args)
    upload_dir = tempfile.mkdtemp(prefix="omnijax-demo-uploads-")
    atexit.register(shutil.rmtree, upload_dir, True)
    previous = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = upload_dir  # read by gradio when the page is built and on every upload
    default = args.model is None
    demo = build_demo(pipe, max_upload_mb=args.max_upload_mb, notice=DEFAULT_MODEL_NOTICE if default else None,
                      examples=default_model_examples() if default else None)
    demo.omnijax_upload_dir, demo.omnijax_previous_temp_dir = upload_dir, previous
    try:
        launch(demo, host=args.host, port=args.port, max_upload_mb=args.max_upload_mb, block=False, quiet=True,
               allow_hosts=tuple(getattr(args, "allow_host", None) or ()))
    except BaseException:
        stop(demo)
        raise
    print(f"[omnijax] serving {pipe.name} ({pipe.family}) on http://{_url_host(args.host)}:{args.port} "
          f"(Ctrl-C stops)", file=sys.stderr, flush=True)
    if not block:
        return demo
    try:
        wait_event(threading.Event())  # until Ctrl-C (or SIGTERM)
    except KeyboardInterrupt:
        pass
    finally:
        stop(demo)
    print("[omnijax] demo stopped", file=sys.stderr)
    return demo


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
