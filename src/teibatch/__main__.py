"""``python -m teibatch`` is the ``teibatch`` command."""

from teibatch.entry import main

if __name__ == "__main__":
    main()
