"""A progress bar for long runs (batch captioning, batch files): tqdm with items/s and ETA, or without tqdm a plain
line redrawn at most once a second. Disabled, it does nothing."""

from __future__ import annotations

import time
from typing import TextIO


class ProgressBar:
    """A bar of ``total`` ``unit``s on ``stream`` (nothing when not ``enabled`` or ``total`` is 0)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO, unit: str = "item"):
        self._bar = None
        self._plain = None
        self._unit = unit
        if not (enabled and total):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._plain = {"total": total, "n": 0, "start": time.perf_counter(), "shown": 0.0, "stream": stream}
            return
        self._bar = tqdm(total=total, unit=unit, file=stream, dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, failed: int) -> None:
        if self._bar is not None:
            self._bar.update(n)
            if failed:
                self._bar.set_postfix(failed=failed, refresh=False)
        elif self._plain is not None:
            p = self._plain
            p["n"] += n
            now = time.perf_counter()
            if now - p["shown"] >= 1.0 or p["n"] == p["total"]:
                p["shown"] = now
                rate = p["n"] / max(now - p["start"], 1e-9)
                eta = (p["total"] - p["n"]) / rate if rate else float("inf")
                print(f"\r{p['n']}/{p['total']} {self._unit}s, {rate:.2f} {self._unit}s/s, ETA {eta:.0f}s, "
                      f"{failed} failed", end="", file=p["stream"], flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._plain is not None and self._plain["n"]:
            print(file=self._plain["stream"])
