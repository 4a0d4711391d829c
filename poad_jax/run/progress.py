"""The training run's progress bar: env steps done, what the run is doing now, and for how long.

A phase can last minutes on a CPU (one batch of generations with a 0.5B
model, the PPO update, the first compilations), and a bar that only moves
when env steps finish would look frozen meanwhile.  So the bar also shows
the current phase with its elapsed time (`now=update 1/2: learning 0:40`), redrawn
every `tick_s` seconds by a background thread; the count itself still
moves only with env steps.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

TICK_SECONDS = 10.0


def clock(seconds: float) -> str:
    """`m:ss` (or `h:mm:ss`) for a duration in seconds."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """A tqdm bar over `total` env steps with a phase that keeps ticking.

    `phase(text)` names what the run does from now on; `advance(n)` counts
    env steps; `show(postfix)` sets the statistics shown after the count.
    Drawing goes through one lock, so the ticker and the training loop never
    draw at once.
    """

    def __init__(self, total: int, initial: int, description: str, tick_s: float = TICK_SECONDS):
        from tqdm import tqdm

        self._bar = tqdm(total=total, initial=min(initial, total), unit="step", dynamic_ncols=True,
                         desc=description)
        self._lock = threading.Lock()
        self._postfix: dict[str, str] = {}
        self._phase, self._since = "starting", time.monotonic()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(tick_s,), name="progress-ticker", daemon=True)
        self._ticker.start()

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            self._draw()

    def _draw(self, steps: int = 0) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            postfix = {"now": f"{self._phase} {clock(time.monotonic() - self._since)}", **self._postfix}
            self._bar.set_postfix(postfix, refresh=False)
            if steps:
                self._bar.update(min(steps, self._bar.total - self._bar.n))
            self._bar.refresh()

    def phase(self, text: str) -> None:
        """From now on the run is doing `text` (shown with the time since this call)."""
        self._phase, self._since = text, time.monotonic()
        self._draw()

    def show(self, postfix: dict[str, Any]) -> None:
        """The statistics shown after the count (a dict of short strings)."""
        self.advance(0, postfix)

    def advance(self, steps: int, postfix: dict[str, Any] | None = None) -> None:
        """Counts `steps` more env steps (never past the total), with new statistics if given."""
        if postfix is not None:
            self._postfix = {str(k): str(v) for k, v in postfix.items()}
        self._draw(steps)

    def note(self, text: str) -> None:
        """Writes `text` as a line of its own above the bar (a warning that must not be drawn over)."""
        from tqdm import tqdm

        with self._lock:
            tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        """Stops the ticker and closes the bar, drawn a last time without the phase."""
        with self._lock:
            self._stop.set()
            self._bar.set_postfix(self._postfix, refresh=False)
        self._ticker.join()
        self._bar.close()


class NoProgress:
    """RunProgress's interface, showing nothing (no bar asked for, or not process 0)."""

    def phase(self, text: str) -> None:
        del text

    def show(self, postfix: dict[str, Any]) -> None:
        del postfix

    def advance(self, steps: int, postfix: dict[str, Any] | None = None) -> None:
        del steps, postfix

    def note(self, text: str) -> None:
        """A warning still reaches the user without a bar: one line on stderr."""
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass
