"""A progress bar for work that can run past a few seconds (``gemmar allreduce``, ``gemmar tune``, a run of
launches on cpu ranks, a puzzle's check), drawn by tqdm (``tqdm.auto``): a widget in a notebook, a line
redrawn in place on a terminal; in a log (not a terminal), a line at most every ``every_s`` seconds and at the
end, so that CI logs stay short. ``ticking``: the bar is redrawn every second even when no step ends, so
that the time shown moves during one long step (a launch of a large problem under the interpreter)."""

import sys
import threading
import time


class ProgressBar:
    def __init__(self, total, label="", stream=None, width=24, every_s=5.0, delay_s=0.0, ticking=False, what=""):
        from tqdm.auto import tqdm   # (here, not at import: the command line parses its flags without it)

        self.total, self.label = max(1, total), label
        self.stream = stream or sys.stderr
        self.live = getattr(self.stream, "isatty", lambda: False)()
        self.what = what
        self.tick_s = 1.0 if self.live else every_s   # (a log gets a line at most every every_s seconds)
        self.shown_from = time.monotonic() + delay_s   # (before then, nothing is drawn: a short run shows no bar)
        # (In a notebook tqdm.auto's class draws a widget, whose bar takes the place of a plain {bar}.)
        drawn = "{bar}" if tqdm.__module__.startswith("tqdm.notebook") else f"[{{bar:{width}}}]"
        self.bar = tqdm(total=self.total, desc=label, file=self.stream if self.live else _Lines(self.stream),
                        ascii=".#", delay=delay_s, postfix=what or None,
                        mininterval=0.1 if self.live else every_s, maxinterval=every_s if not self.live else 10,
                        bar_format=f"[gemmar] {{desc}}{drawn} {{n_fmt}}/{{total_fmt}} {{elapsed}}<{{remaining}}"
                                   f"{{postfix}}", dynamic_ncols=False)
        self.bar.format_dict  # (fails now, not mid-run, if this tqdm cannot format the bar)
        self._stop = threading.Event()
        if ticking:
            threading.Thread(target=self._tick, daemon=True).start()

    @property
    def done(self):
        return self.bar.n

    def _tick(self):
        while not self._stop.wait(self.tick_s):
            try:
                self._refresh()
            except Exception:   # noqa: BLE001 - (a bar closed meanwhile: nothing to draw)
                return

    def update(self, done=None, what=None):
        """Set how many steps are done (or one more), and what the current step is; redraw if due (always
        at the last step)."""
        done = min(self.total, self.bar.n + 1 if done is None else done)
        if what is not None and what != self.what:
            self.what = what
            self.bar.set_postfix_str(what, refresh=False)
        self.bar.update(done - self.bar.n)
        if done == self.total:
            self._refresh()

    def _refresh(self):
        if time.monotonic() >= self.shown_from:
            self.bar.refresh()

    def clear(self):
        """On a terminal, wipe the bar's line so that a line of results can be printed there (the next update
        draws the bar again under it)."""
        if self.live:
            self.bar.clear()

    def close(self):
        """End the bar (its last state stays shown)."""
        self._stop.set()
        self.bar.close()


class _Lines:
    """A log's stream for tqdm: each redraw (tqdm's "\\r" + the bar) becomes a line of its own, so that a log,
    with other lines between the bar's, reads line by line."""

    def __init__(self, stream):
        self.stream, self.last = stream, None

    def write(self, text):
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:   # (the last state, drawn by the last update and again by close)
            self.stream.write(line + "\n")
            self.last = line

    def flush(self):
        self.stream.flush()
