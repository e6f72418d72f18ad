"""The ``teibatch`` console command: a Ctrl-C at any moment exits 1, even while the command is importing.

Click turns a Ctrl-C into exit code 1 once it runs; before that, while ``teibatch.cli`` and its
imports load, Python would print a traceback and die of the signal instead.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Import the command line and run it."""
    try:
        from teibatch.cli import main as cli

        cli()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(1)
