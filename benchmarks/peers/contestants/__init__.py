"""One module per contestant, each written the way its library's docs show (see the README).

Each runs as ``python -m contestants.<module> CONFIG.json`` in its own process: it reads the corpus,
embeds it on the servers named in the config, and writes ``id`` and ``embedding`` to Parquet under
``<output>/vectors``. Only :mod:`contestants.common` is shared glue (config, the JSONL reader, the
Parquet writer, the result file); nothing in it handles a bad document.
"""
