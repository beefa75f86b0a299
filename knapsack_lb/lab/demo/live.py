"""The live view: phase, time left, weights and latency per DIP.

On a terminal it is a ``rich.live.Live`` table redrawn every progress line; elsewhere (CI,
tests, a pipe) it degrades to one plain log line every ``plain_every`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table


class LiveView:
    """``with LiveView(console, names) as view: view.update(...)``."""

    def __init__(self, console: Console, names: Sequence[str], plain_every: float = 5.0) -> None:
        self.console = console
        self.names = list(names)
        self.plain_every = plain_every
        self._live: Live | None = None
        self._last_plain = 0.0

    @property
    def interactive(self) -> bool:
        return self.console.is_terminal

    def __enter__(self) -> LiveView:
        if self.interactive:
            self._live = Live(Table(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def message(self, text: str) -> None:
        """A line that stays (phase changes, learning progress)."""
        self.console.print(text) if self._live is None else self._live.console.print(text)

    def update(self, phase: str, seconds_left: float, weights: Mapping[str, float],
               latency: Mapping[str, tuple[int, float]], note: str = "") -> None:
        """``latency``: DIP -> (answers, mean latency in s) over the last progress interval."""
        if self._live is not None:
            self._live.update(self._table(phase, seconds_left, weights, latency, note))
            return
        now = time.monotonic()
        if now - self._last_plain < self.plain_every:
            return
        self._last_plain = now
        cells = " ".join(
            f"{n}=w{weights.get(n, 0.0):.2f}/" + (f"{latency[n][1] * 1000:.0f}ms" if n in latency else "-")
            for n in self.names
        )
        self.console.print(f"[{phase}] {seconds_left:5.0f}s left {note} {cells}", highlight=False, markup=False)

    def _table(self, phase: str, seconds_left: float, weights: Mapping[str, float],
               latency: Mapping[str, tuple[int, float]], note: str) -> Table:
        table = Table(title=f"{phase} - {seconds_left:.0f} s left {note}")
        table.add_column("DIP")
        table.add_column("HAProxy weight", justify="right")
        table.add_column("answers/s", justify="right")
        table.add_column("mean latency (ms)", justify="right")
        for name in self.names:
            count, mean = latency.get(name, (0, float("nan")))
            table.add_row(name, f"{weights.get(name, 0.0):.3f}", str(count),
                          "-" if count == 0 else f"{mean * 1000:.1f}")
        return table
