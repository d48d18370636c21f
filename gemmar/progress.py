"""A progress bar for commands that can run past a few seconds (``gemmar allreduce`` on cpu ranks, where each
launch runs under the Triton interpreter): one line, redrawn in place on a terminal; in a log (not a
terminal), a line at most every ``every_s`` seconds and at the end, so that CI logs stay short."""

import sys
import time


class ProgressBar:
    def __init__(self, total, label="", stream=None, width=24, every_s=5.0):
        self.total, self.label, self.width, self.every_s = max(1, total), label, width, every_s
        self.stream = stream or sys.stderr
        self.done, self.started, self.shown_at = 0, time.monotonic(), None
        self.live = getattr(self.stream, "isatty", lambda: False)()
        self.what = ""

    def update(self, done=None, what=None):
        """Set how many steps are done (or one more), and what the current step is; redraw if due."""
        self.done = min(self.total, self.done + 1 if done is None else done)
        if what is not None:
            self.what = what
        now = time.monotonic()
        if self.live or self.done == self.total or self.shown_at is None or now - self.shown_at >= self.every_s:
            self.shown_at = now
            self._draw(now)

    def _draw(self, now):
        filled = self.width * self.done // self.total
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else None
        eta = f", ~{left:.0f} s left" if left is not None and self.done < self.total else ""
        line = (f"[gemmar] {self.label}[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:.0f} s{eta}{': ' + self.what if self.what else ''}")
        if self.live:
            self.stream.write("\r" + line + "\033[K" + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self):
        """On a terminal, wipe the bar's line so that a line of results can be printed there (the next update
        draws the bar again under it)."""
        if self.live and self.shown_at is not None:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def close(self):
        """End the bar's line on a terminal (when it stopped before its total)."""
        if self.live and self.shown_at is not None and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()
