"""How the ``teibatch`` process ends once a command is over or interrupted: at once, with its exit code.

Standard library only, so that :mod:`teibatch.entry` can use it before any import that a Ctrl-C
might interrupt, and the command modules can use it without importing the entry point back.
"""

from __future__ import annotations

import logging
import os
import sys

from teibatch.native_stderr import quiet_native


def exit_settled(code: int) -> None:
    """Exit with ``code`` now that the command has finished, skipping the interpreter's teardown.

    A command that used Ray has shut Ray down, stopped its servers and written its report by the
    time it returns; what is left is Python unloading Ray's modules and threads, time that a small
    run would otherwise spend after its work is done (docs/benchmarks.md).
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_interrupted() -> None:
    """Say so and exit 1 at once.

    ``os._exit``: a library imported half-way (Ray's core among them) may have left its own SIGINT
    handling behind, and the interpreter's shutdown would then end the process by the signal
    (exit -2) instead of the code. A run's report and servers are already settled when this runs.
    """
    quiet_native()
    print("error: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
