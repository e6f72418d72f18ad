"""Every warning a command prints, in teibatch's own format: ``warning: message`` beside its lines.

teibatch's modules and the libraries it uses (fsspec, botocore, Ray's driver side) report through
Python's :mod:`logging`, and some libraries through :func:`warnings.warn`. Left alone, each comes
out as its library formats it (``WARNING:name:message``, Ray's tab-separated lines, a warning's
file and line), between teibatch's own lines. :func:`log_to_stderr`, called by every command,
routes all of them to one handler that writes ``<level>: <message>``; ``teibatch run`` then hands
them to its progress reporter (:func:`log_through`): a timestamped line, a line above the live bar,
or a JSON object with ``--log-format json``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Protocol

ROUTED_LIBRARY_LOGGERS = ("ray",)
"""Loggers that print through handlers of their own, not the root's: routed through it instead."""


class _Messages(Protocol):
    def message(self, text: str, *, event: str = "message", **fields: Any) -> None: ...


class _JsonEvents(Protocol):
    def emit(self, event: str, level: str = "info", **fields: Any) -> None: ...


def log_line(record: logging.LogRecord) -> str:
    """A log record as one teibatch line: ``warning: message`` (a Python warning: its first line)."""
    text = record.getMessage()
    if record.name == "py.warnings":  # "file:line: Category: message\n  source line"
        text = text.strip().splitlines()[0]
    if record.exc_info and logging.getLogger().isEnabledFor(logging.DEBUG):
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return f"{record.levelname.lower()}: {text}"


class TeibatchHandler(logging.Handler):
    """The handlers teibatch installs on the root logger; one replaces another (:func:`log_through`)."""


class StderrLines(TeibatchHandler):
    """Writes each record as :func:`log_line` to whatever ``sys.stderr`` is when it is emitted."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(log_line(record) + "\n")
            sys.stderr.flush()
        except Exception:  # a log line must never break the command
            self.handleError(record)


class ReporterLines(TeibatchHandler):
    """Hands each record to a progress reporter as a message (event ``log``), so that it is printed as
    the run's other lines are: with a timestamp, or above the live progress bar."""

    def __init__(self, reporter: _Messages) -> None:
        super().__init__()
        self.reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.reporter.message(log_line(record), event="log", logger=record.name,
                                  level=record.levelname.lower())
        except Exception:  # a log line must never break the run
            self.handleError(record)


class JsonLogHandler(TeibatchHandler):
    """Log records as JSON lines through a ``JsonLinesReporter`` (``pipeline/progress.py``), so that with
    ``--log-format json`` every line of the run's log has the same shape and run id."""

    def __init__(self, reporter: _JsonEvents) -> None:
        super().__init__()
        self.reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = log_line(record).split(": ", 1)[1]  # the level is a field of its own
            self.reporter.emit("log", record.levelname.lower(), logger=record.name, message=message)
        except Exception:  # a log line must never break the run
            self.handleError(record)


def log_to_stderr(debug: bool = False) -> None:
    """Send every log record and Python warning to stderr as :func:`log_line`; at ``debug``, debug ones too.

    Called once per command. Replaces any handler an earlier call (or :func:`log_through`) installed
    and Python's default one; handlers others added (a test's log capture) are kept.
    """
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    log_through(StderrLines())
    # Off, then on: captureWarnings(True) does nothing when it believes it is already on, which it
    # still does after a warnings.catch_warnings() block put the original showwarning back.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    for name in ROUTED_LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True


def log_through(handler: logging.Handler) -> None:
    """Make ``handler`` the one that prints log records (at the level :func:`log_to_stderr` set)."""
    root = logging.getLogger()
    handler.setLevel(root.level)
    root.handlers = [h for h in root.handlers if not _ours(h)] + [handler]


def _ours(handler: logging.Handler) -> bool:
    """One of teibatch's handlers, or Python's default one (``logging.basicConfig`` by anyone)."""
    return isinstance(handler, TeibatchHandler) or type(handler) is logging.StreamHandler
