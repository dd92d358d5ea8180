"""Video decode benchmark: time and peak memory to sample a 60 s 720p file at 2 frames a second.

    python -m bench.video [--out bench/results] [--seconds 60] [--fps 30]

Writes a 60 s 1280 x 720 H.264 file at 30 fps (key frame every 2 s; PyAV, the first run only, cached in
``--out``), then, each in a fresh subprocess so that peak memory is its own, samples it at 2 frames a second the
way the Qwen3-Omni processor does (``Qwen2VLVideoProcessor.sample_frames``: 120 frames):

* ``omnijax``: ``preprocess.video_decode`` (header probe, seek to the sampled frames, bounded threads), frames kept
  at full size;
* ``omnijax+resize``: the same, each kept frame resized at once to the Qwen3-Omni video size (what the processor
  holds: 128 x 32 x 32 .. 768 x 32 x 32 pixels a frame, torchvision's uint8 bicubic in numpy);
* ``transformers``: ``transformers.video_utils.read_video_pyav`` (decodes every frame up to the last sampled one,
  converting only the sampled ones).

and the same with 32 frames spread over the file (Gemma 4's default sampling), where seeking skips most of it.

Reports seconds, peak resident memory (VmHWM, imports included) and the rise over the resident memory before
decoding; writes ``video-<time>.json``, ``latest-video.json`` and ``latest-video.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

from bench.load import MB, _status_kb


def write_file(path: pathlib.Path, seconds: int, fps: int) -> None:
    """A moving test pattern with noise, 1280 x 720, H.264 (x264 veryfast, CRF 23), key frame every 2 s."""
    import av
    import numpy as np

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:720, 0:1280]
    base = np.stack([xx * 255 // 1279, yy * 255 // 719, (xx + yy) % 256], axis=-1).astype(np.uint8)
    noise = rng.integers(0, 24, (8, 720, 1280, 3), dtype=np.uint8)
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
        stream.codec_context.gop_size = 2 * fps
        stream.options = {"preset": "veryfast", "crf": "23"}
        for i in range(seconds * fps):
            frame = np.roll(base, 8 * i, axis=1) + noise[i % 8]
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)


def worker(method: str, path: str, sampler: str = "2fps") -> dict:
    import numpy as np

    from omnijax.preprocess.qwen3_omni.image import smart_resize
    from omnijax.preprocess.resize_uint8 import resize_uint8
    from omnijax.preprocess.video_decode import decode_frames, probe
    from omnijax.preprocess.video_sampling import qwen_frame_indices, uniform_frame_indices

    info = probe(pathlib.Path(path))
    indices = qwen_frame_indices(info.frames, info.fps, fps=2.0) if sampler == "2fps" else \
        uniform_frame_indices(info.frames, info.fps, num_frames=32)
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    if method == "transformers":
        from transformers.video_utils import read_video_pyav

        frames, _ = read_video_pyav(path, lambda metadata, **_: np.asarray(indices))
        shape = frames.shape
    else:
        convert = (lambda f: f)
        if method == "omnijax+resize":
            height, width = smart_resize(info.height, info.width, 32, 128 * 32 * 32, 768 * 32 * 32)
            convert = (lambda f: resize_uint8(f, height, width))
        frames, _ = decode_frames(info, indices, convert)
        shape = (len(frames),) + frames[0].shape
    seconds = time.perf_counter() - start
    return {"method": method, "sampling": sampler, "seconds": round(seconds, 3), "frames": int(shape[0]), "frame_shape": list(shape[1:]),
            "peak_rss_mb": round(_status_kb("VmHWM") / 1024, 1),
            "rise_mb": round((_status_kb("VmHWM") - before) / 1024, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--worker", nargs=3, metavar=("METHOD", "FILE", "SAMPLER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"video-720p-{args.seconds}s-{args.fps}fps.mp4"
    if not path.exists():
        started = time.perf_counter()
        write_file(path, args.seconds, args.fps)
        print(f"wrote {path} ({path.stat().st_size / MB:.1f} MB) in {time.perf_counter() - started:.0f} s")
    rows = []
    runs = [(m, "2fps") for m in ("omnijax", "omnijax+resize", "transformers")]
    runs += [(m, "32frames") for m in ("omnijax", "transformers")]
    for method, sampler in runs:
        done = subprocess.run([sys.executable, "-m", "bench.video", "--worker", method, str(path), sampler],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1])
    import av

    result = {"file": path.name, "size_mb": round(path.stat().st_size / MB, 1), "sampled_fps": 2.0,
              "pyav": av.__version__, "machine": platform.machine(), "cpus": __import__("os").cpu_count(),
              "rows": rows}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"video-{stamp}.json", "latest-video.json"):
        (out / name).write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"Sampling {path.name} ({result['size_mb']} MB, 1280x720, 30 fps, key frame every 2 s) at 2 fps (the "
             f"Qwen3-Omni sampler: {rows[0]['frames']} frames) and 32 frames (Gemma 4's default), PyAV "
             f"{result['pyav']}, {result['cpus']} CPUs", "",
             "| method | sampling | frames | seconds | peak RSS MB | rise MB | frames kept as |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['sampling']} | {r['frames']} | {r['seconds']} | {r['peak_rss_mb']} | "
              f"{r['rise_mb']} | {'x'.join(map(str, r['frame_shape']))} |" for r in rows]
    (out / "latest-video.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
