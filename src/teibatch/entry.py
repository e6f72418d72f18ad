"""The ``teibatch`` console command: a Ctrl-C at any moment exits 1, even while the command is importing.

Click turns a Ctrl-C into exit code 1 once it runs; before that, while ``teibatch.cli`` and its
imports load, Python would print a traceback and die of the signal instead.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Import the command line and run it."""
    try:
        from teibatch.cli import main as cli

        cli()
    except KeyboardInterrupt:
        exit_interrupted()


def exit_interrupted() -> None:
    """Say so and exit 1 at once.

    ``os._exit``: a library imported half-way (Ray's core among them) may have left its own SIGINT
    handling behind, and the interpreter's shutdown would then end the process by the signal
    (exit -2) instead of the code. A run's report and servers are already settled when this runs.
    """
    print("error: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
