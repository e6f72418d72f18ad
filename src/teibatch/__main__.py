"""``python -m teibatch`` is the ``teibatch`` command."""

from teibatch.cli import main

if __name__ == "__main__":
    main()
