"""The ``teibatch`` console command: a Ctrl-C at any moment exits 1, even while the command is importing.

Click turns a Ctrl-C into exit code 1 once it runs; before that, while ``teibatch.cli`` and its
imports load, Python would print a traceback and die of the signal instead.
"""

from __future__ import annotations

import logging
import os
import sys


def main() -> None:
    """Import the command line and run it."""
    # Ray's core would install a crash handler for SIGTERM in the run's Ray thread, and a SIGTERM
    # would then abort the driver with no report and its servers left up. The command handles
    # SIGTERM itself (pipeline/interrupts.py); Ray reads this before it is imported.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        from teibatch.cli import main as cli

        cli()
    except KeyboardInterrupt:
        exit_interrupted()
    except SystemExit as done:
        if "ray" in sys.modules and (done.code is None or isinstance(done.code, int)):
            exit_settled(done.code or 0)
        raise


def exit_settled(code: int) -> None:
    """Exit with ``code`` now that the command has finished, skipping the interpreter's teardown.

    A command that used Ray has shut Ray down, stopped its servers and written its report by the
    time it returns; what is left is Python unloading Ray's modules and threads, about half a
    second that a 100-document run would otherwise spend after its work is done.
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
    print("error: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
