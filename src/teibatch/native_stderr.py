"""teibatch's own stderr lines apart from those that native code writes to file descriptor 2.

Ray's C++ core, inside the driver, writes its error lines straight to descriptor 2; teibatch writes
through ``sys.stderr``. :func:`separate`, called once by the ``teibatch`` command before anything
else, gives ``sys.stderr`` a descriptor of its own on the same terminal, pipe or file, so that both
still show during a run. Once a run is interrupted, :func:`quiet_native` points descriptor 2 at
``/dev/null``: what Ray's core says then is about its own teardown (the tasks the interrupt
cancelled failing to report back to a driver that is leaving), nothing a user can act on, and it
would land between teibatch's last lines. Standard library only, like :mod:`teibatch.cli_exit`.
"""

from __future__ import annotations

import io
import os
import sys

_separated = False


def separate() -> None:
    """Make ``sys.stderr`` write to a duplicate of descriptor 2, leaving descriptor 2 to native code.

    Only the ``teibatch`` process's entry point calls this: a test runner that calls the command
    in-process keeps its own streams, and :func:`quiet_native` then does nothing.
    """
    global _separated
    stream = sys.stderr
    if _separated or stream is None:
        return
    try:
        if stream.fileno() != 2:
            return
        stream.flush()
        own = os.dup(2)
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    sys.stderr = io.TextIOWrapper(os.fdopen(own, "wb", buffering=0), encoding=stream.encoding,
                                  errors=stream.errors, line_buffering=True, write_through=True)
    _separated = True


def quiet_native() -> None:
    """From now on, drop what native code writes to descriptor 2 (teibatch's own lines still show)."""
    if not _separated:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, 2)
    finally:
        os.close(null)
