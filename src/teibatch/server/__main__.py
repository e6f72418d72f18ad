"""``python -m teibatch.server``: the ``serve`` command without the rest of teibatch's CLI."""

from __future__ import annotations

from teibatch.server.cli import serve

if __name__ == "__main__":
    serve(prog_name="python -m teibatch.server")
