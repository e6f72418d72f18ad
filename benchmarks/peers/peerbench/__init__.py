"""The harness of the peer benchmark: corpus, servers, measured subprocesses, output checks, the table."""
