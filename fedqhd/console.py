"""A quiet console for a run: a header, one line per round and a summary; the rest to
``run.log`` in the run folder.

Flower logs seven lines a round (a 15-key metrics dict among them) and a ~400-line
"Final results" dump; gymnasium's Box2D import and Ray print known-harmless warnings.
They bury the one line that matters, so :class:`RunConsole` keeps them off the console
and writes everything to ``run.log``; run-config ``verbose = true`` shows it all again.

What reaches the console while a :class:`RunConsole` is active:

- Flower-logger records marked for it (``extra=CONSOLE``: our header, round and summary
  lines), and every WARNING or ERROR record that is not known-harmless: errors are never
  hidden;
- with ``streams=True`` (the ServerApp under ``flwr run``, where Ray's workers print
  through this process's stdout and stderr), every raw output line except the
  known-harmless warnings and the INFO/DEBUG log lines of Ray's workers: tracebacks and
  anything unexpected pass;
- warnings (``warnings.warn``) that are not known-harmless.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from flwr.common.logger import FLOWER_LOGGER

__all__ = ["CONSOLE", "KNOWN_HARMLESS", "LOG_NAME", "RunConsole", "console_level",
           "is_harmless", "summary_line"]

LOG_NAME = "run.log"  #: the file in the run folder that gets everything
#: ``extra=`` of a log record meant for the quiet console (header, rounds, summary)
CONSOLE: dict[str, Any] = {"fedqhd_console": True}

#: messages known to be harmless here: Box2D's SWIG types (gymnasium's LunarLander),
#: Ray's accelerator tip, and Flower's note on its default federation size (it prints it
#: even when the run asks for another size)
KNOWN_HARMLESS: tuple[re.Pattern[str], ...] = (
    re.compile(r"builtin type (SwigPyPacked|SwigPyObject|swigvarlink) has no __module__"),
    re.compile(r"Ray will no longer override accelerator visible devices"),
    re.compile(r"default simulated SuperNodes changed from 10 to 2"),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: the prefix Ray's driver puts before a worker's output line: ``(ClientAppActor pid=12)``
_RAY_PREFIX = re.compile(r"^\([^()]*pid=\d+[^()]*\)\s?")
#: a Flower log line at INFO or DEBUG, colours removed (``INFO :      text``)
_INFO_LINE = re.compile(r"^(DEBUG|INFO)\s*:")

_ACTIVE: RunConsole | None = None


def _console_handlers() -> list[logging.Handler]:
    """Flower's handlers that print (not files a user attached)."""
    return [h for h in FLOWER_LOGGER.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


def is_harmless(text: str) -> bool:
    """Whether ``text`` (a message or an output line) is a known-harmless warning."""
    return any(p.search(text) for p in KNOWN_HARMLESS)


def summary_line(label: str, status: str, result: str | None, run_dir: Path | str,
                 reason: str | None = None) -> str:
    """The run's last console line: what it achieved, or why it failed, and where its
    results are (so a user never has to scroll back for either)."""
    if status == "failed":
        return f"{label}: failed: {reason or 'unknown reason'}; results in {run_dir}"
    return f"{label}: {status}: {result}; results in {run_dir}"


class _QuietFilter(logging.Filter):
    """On Flower's console handlers: only records marked :data:`CONSOLE`, and warnings
    and errors that are not known-harmless."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "fedqhd_console", False):
            return True
        return record.levelno >= logging.WARNING and not is_harmless(record.getMessage())


class _LogHandler(logging.Handler):
    """Every Flower record, to the console's run log (held until the run folder exists)."""

    def __init__(self, console: RunConsole, level: int) -> None:
        super().__init__(level)
        self.console = console
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.write_log(_ANSI.sub("", self.format(record)) + "\n")
        except Exception:  # a log that cannot be written must not end the run
            self.handleError(record)


class _FilteredStream:
    """Stands in for ``sys.stdout``/``sys.stderr``: every complete line goes to the run
    log, and to the real stream unless the console drops it (:meth:`RunConsole.keep_line`).
    Text without a newline that carries a ``\\r`` (a progress bar) passes at once."""

    def __init__(self, console: RunConsole, target: TextIO) -> None:
        self._console, self._target = console, target
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            out = []
            for line in lines:
                self._console.write_log(_ANSI.sub("", line) + "\n")
                if self._console.keep_line(line):
                    out.append(line + "\n")
            if "\r" in self._pending:
                out.append(self._pending)
                self._pending = ""
        if out:
            self._target.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def release(self) -> None:
        """Write out a last line without a newline (when the console ends)."""
        if self._pending:
            pending, self._pending = self._pending, ""
            self.write(pending + "\n")

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._target, name)


class RunConsole:
    """Context manager: a quiet console while a run goes, ``run.log`` in its folder.

    ``verbose``: keep every line on the console (``run.log`` is still written).
    ``run_dir``: the run folder (else :meth:`open_log` names it later; what is logged
    before is held and written then). ``streams``: filter raw stdout/stderr lines too
    (the ServerApp process, where Ray's workers print). Entered while another one is
    active, it only names the run folder to that one (the ServerApp enters one before
    the folder exists; :func:`~fedqhd.server.app.run_federation` enters one for
    in-process runs).
    """

    def __init__(self, verbose: bool = False, run_dir: Path | str | None = None,
                 streams: bool = False) -> None:
        self.verbose, self.streams = verbose, streams
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._outer: RunConsole | None = None
        self._file: TextIO | None = None
        self._held: list[str] = []
        self._lock = threading.RLock()
        self._filtered: list[tuple[logging.Handler, _QuietFilter]] = []
        self._handler: _LogHandler | None = None
        self._streams: dict[str, tuple[TextIO, _FilteredStream]] = {}
        self._showwarning: Any = None
        self._drop_continuation = False

    # ---- entering and leaving ----
    def __enter__(self) -> RunConsole:
        global _ACTIVE
        if _ACTIVE is not None:
            self._outer = _ACTIVE
            if self.run_dir is not None:
                _ACTIVE.open_log(self.run_dir)
            return _ACTIVE
        consoles = _console_handlers()
        level = min((h.level for h in consoles), default=logging.INFO) or logging.INFO
        self._handler = _LogHandler(self, level)
        FLOWER_LOGGER.addHandler(self._handler)
        if not self.verbose:
            for handler in consoles:
                quiet = _QuietFilter()
                handler.addFilter(quiet)
                self._filtered.append((handler, quiet))
        if self.streams:
            for name in ("stdout", "stderr"):
                real = getattr(sys, name)
                stand_in = _FilteredStream(self, real)
                self._streams[name] = (real, stand_in)
                setattr(sys, name, stand_in)
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._warning
        if self.run_dir is not None:
            self.open_log(self.run_dir)
        _ACTIVE = self
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _ACTIVE
        if self._outer is not None:
            return
        _ACTIVE = None
        if exc is not None and not isinstance(exc, KeyboardInterrupt | SystemExit):
            import traceback

            self.write_log("".join(traceback.format_exception(kind, exc, tb)))
        if warnings.showwarning == self._warning:
            warnings.showwarning = self._showwarning
        for name, (real, stand_in) in self._streams.items():
            stand_in.release()
            if getattr(sys, name) is stand_in:
                setattr(sys, name, real)
        for handler, quiet in self._filtered:
            handler.removeFilter(quiet)
        if self._handler is not None:
            FLOWER_LOGGER.removeHandler(self._handler)
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # ---- the log ----
    def open_log(self, run_dir: Path | str) -> Path:
        """Write ``run.log`` in ``run_dir`` from now on (appended: a resumed run's log
        goes on), starting with what was held."""
        path = Path(run_dir) / LOG_NAME
        with self._lock:
            if self._file is None:
                self.run_dir = Path(run_dir)
                self._file = path.open("a", encoding="utf-8")
                self._file.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} run log "
                                 f"(verbose = {str(self.verbose).lower()}) ----\n")
                self._file.writelines(self._held)
                self._held.clear()
                self._file.flush()
        return path

    def write_log(self, text: str) -> None:
        """Append ``text`` to the run log (held until :meth:`open_log`)."""
        with self._lock:
            if self._file is None:
                self._held.append(text)
            else:
                self._file.write(text)
                self._file.flush()

    # ---- what the console keeps ----
    def keep_line(self, line: str) -> bool:
        """Whether a raw output line stays on the console: not a known-harmless warning
        (nor the source line Python prints under it), not an INFO/DEBUG log line of a Ray
        worker; everything else (tracebacks, errors, the unexpected) does."""
        plain = _ANSI.sub("", line)
        worker = _RAY_PREFIX.match(plain)
        body = plain[worker.end():] if worker else plain
        continuation, self._drop_continuation = self._drop_continuation, False
        if self.verbose:
            return True
        if is_harmless(body):
            self._drop_continuation = True
            return False
        if continuation and body.startswith(" "):
            return False
        return not (worker and _INFO_LINE.match(body))

    def _warning(self, message: Warning | str, category: type[Warning], filename: str,
                 lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
        """``warnings.showwarning`` while active: every warning to the log; to the console
        those that are not known-harmless (or all, verbose)."""
        text = warnings.formatwarning(message, category, filename, lineno, line)
        self.write_log(text)
        if self.verbose or not is_harmless(str(message)):
            real = self._streams["stderr"][0] if "stderr" in self._streams else sys.stderr
            stream = file or real
            try:
                stream.write(text)
            except OSError:
                pass


@contextmanager
def console_level(level: int) -> Iterator[None]:
    """Raise the level of Flower's console handlers (not of its logger, so a
    :class:`RunConsole`'s log still gets every record): studies that run many federations
    in process show their own progress, not each run's round lines."""
    handlers = _console_handlers()
    before = [h.level for h in handlers]
    for handler in handlers:
        handler.setLevel(max(level, handler.level))
    try:
        yield
    finally:
        for handler, old in zip(handlers, before, strict=True):
            handler.setLevel(old)
