"""How every ``teibatch`` command fails: a :class:`TeibatchError` becomes its exit code and one line.

A module of its own so that every command module can use it without importing ``teibatch.cli``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from teibatch.cli_exit import exit_interrupted
from teibatch.errors import TeibatchError

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(command: F) -> F:
    """Turn a :class:`TeibatchError` into its exit code and a one-line message (a traceback with --debug)."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TeibatchError as exc:
            context = click.get_current_context()
            if context.find_root().params.get("debug"):
                raise
            if context.params.get("log_format") == "json":
                from teibatch.pipeline.progress import JsonLinesReporter

                lines = JsonLinesReporter(sys.stderr)
                lines.bind(context.meta.get("teibatch.run_id"))
                lines.emit("error", "error", error=type(exc).__name__, exit_code=exc.exit_code, message=str(exc))
            else:
                click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            exit_interrupted()

    return wrapper  # type: ignore[return-value]
