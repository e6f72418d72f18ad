"""The ``teibatch`` console command: a Ctrl-C at any moment exits 1, even while the command is importing.

Click turns a Ctrl-C into exit code 1 once it runs; before that, while ``teibatch.cli`` and its
imports load, Python would print a traceback and die of the signal instead.
"""

from __future__ import annotations

import os
import sys

from teibatch.cli_exit import exit_interrupted, exit_settled
from teibatch.native_stderr import separate


def main() -> None:
    """Import the command line and run it."""
    separate()  # Ray's core writes to descriptor 2 directly; teibatch's lines get a descriptor of their own
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

