"""The ``serve`` command: a TEI-compatible server, flags named as TEI's (``text-embeddings-router``).

Registered in the main CLI by the lead (``main.add_command(serve)``); also runnable on its own as
``python -m teibatch.server``. Options that TEI lacks are teibatch's own (backend, capacity model,
fault injection, recording, ready file). The command only parses, builds a
:class:`~teibatch.server.config.ServerConfig` and calls :func:`~teibatch.server.runner.run_server`.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from teibatch.server.config import (
    BACKENDS,
    DEFAULT_BATCH_OVERHEAD_S,
    DEFAULT_DIMENSION,
    DEFAULT_HOSTNAME,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_CLIENT_BATCH_SIZE,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_INPUT_LENGTH,
    DEFAULT_MODEL_ID,
    DEFAULT_PAYLOAD_LIMIT,
    MODEL_KINDS,
    POOLINGS,
    config_from_options,
)

EPILOG = """\b
Examples:
  teibatch serve --port 8080
  teibatch serve --port 0 --ready-file /tmp/tei.json --max-client-batch-size 64
  teibatch serve --api-key secret --simulate-gpu 50000 --max-batch-tokens 16384
  teibatch serve --model-kind reranker --port 8081
  teibatch serve --backend sentence-transformers --model-id sentence-transformers/all-MiniLM-L6-v2
  teibatch serve --backend numpy --model-id sentence-transformers/all-MiniLM-L6-v2
  teibatch serve --fault-seed 7 --fault-rate-429 0.1 --fault-rate-drop 0.05 --record-texts
"""


def _prompt(ctx: click.Context, param: click.Parameter,
            values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=TEXT, got {value!r}")
        pairs.append((name, text))
    return tuple(pairs)


@click.command(epilog=EPILOG, context_settings={"show_default": True, "max_content_width": 100})
@click.option("--model-id", default=DEFAULT_MODEL_ID,
              help="Name the server reports in /info; for a real model's backend, the model to load.")
@click.option("--served-model-name", default=None,
              help="Name for /info and the OpenAI route; default: model id.")
@click.option("--revision", default=None, help="Reported as /info model_sha.")
@click.option("--dimension", type=click.IntRange(min=1), default=DEFAULT_DIMENSION,
              help="Vector length of the hashing backend.")
@click.option("--backend", type=click.Choice(BACKENDS), default="hashing",
              help="hashing: deterministic, no download. sentence-transformers: a real model (extra 'st'). "
                   "numpy: a BERT sentence model without torch (extra 'minilm').")
@click.option("--model-kind", type=click.Choice(MODEL_KINDS), default="embedding",
              help="reranker serves /rerank and /predict and refuses to embed (424), like a TEI reranker.")
@click.option("--pooling", type=click.Choice(POOLINGS), default="mean", help="splade turns on /embed_sparse.")
@click.option("--max-client-batch-size", type=click.IntRange(min=1), default=DEFAULT_MAX_CLIENT_BATCH_SIZE)
@click.option("--max-concurrent-requests", type=click.IntRange(min=1),
              default=DEFAULT_MAX_CONCURRENT_REQUESTS,
              help="Inputs in flight, all requests together; over it: 429.")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=DEFAULT_MAX_BATCH_TOKENS)
@click.option("--max-batch-requests", type=click.IntRange(min=1), default=None)
@click.option("--max-input-length", type=click.IntRange(min=1), default=DEFAULT_MAX_INPUT_LENGTH,
              help="Tokens per input, special tokens included.")
@click.option("--payload-limit", type=click.IntRange(min=1), default=DEFAULT_PAYLOAD_LIMIT,
              help="Body bytes.")
@click.option("--auto-truncate", type=click.BOOL, default=True, is_flag=False, flag_value=True,
              metavar="[true|false]", help="What truncate=null means; '--auto-truncate false' as in TEI.")
@click.option("--no-auto-truncate", is_flag=True, default=False, help="Same as '--auto-truncate false'.")
@click.option("--api-key", envvar="API_KEY", default=None, show_default=False, show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics.")
@click.option("--hostname", default=DEFAULT_HOSTNAME, help="Address to bind.")
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=0, help="0 picks a free port.")
@click.option("--tokenization-workers", type=click.IntRange(min=1), default=1)
@click.option("--prompt", "prompts", multiple=True, callback=_prompt, metavar="NAME=TEXT",
              help="A Sentence Transformers prompt for prompt_name (repeatable).")
@click.option("--default-prompt-name", default=None)
@click.option("--default-prompt", default=None)
@click.option("--simulate-gpu", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="TOKENS_PER_S",
              help="Answer each batch after overhead + tokens / TOKENS_PER_S s, like a GPU of that speed.")
@click.option("--batch-overhead-s", type=click.FloatRange(min=0), default=DEFAULT_BATCH_OVERHEAD_S,
              help="Fixed time per simulated batch.")
@click.option("--record-texts", is_flag=True, default=False,
              help="Keep a digest multiset of embedded inputs in /teibatch/stats.")
@click.option("--fault-seed", type=int, default=0)
@click.option("--fault-rate-429", type=click.FloatRange(0, 1), default=0.0)
@click.option("--fault-rate-503", type=click.FloatRange(0, 1), default=0.0)
@click.option("--fault-rate-424", type=click.FloatRange(0, 1), default=0.0)
@click.option("--fault-rate-500", type=click.FloatRange(0, 1), default=0.0)
@click.option("--fault-rate-drop", type=click.FloatRange(0, 1), default=0.0,
              help="Drop the connection halfway through a 200 answer.")
@click.option("--fault-rate-latency", type=click.FloatRange(0, 1), default=0.0)
@click.option("--fault-latency-s", type=click.FloatRange(min=0), default=1.0)
@click.option("--fault-hang-after", type=click.IntRange(min=1), default=None,
              help="This request never answers.")
@click.option("--fault-exit-after", type=click.IntRange(min=1), default=None,
              help="Stop after this many inference requests (exit code 3).")
@click.option("--fault-tokenize", type=click.BOOL, default=False,
              help="Draw faults for POST /tokenize too (as a proxy in front of TEI might answer).")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help='Once listening, write {"url": ..., "pid": ...} here atomically.')
def serve(**options: Any) -> None:
    """Serve a TEI-compatible embedding API (TEI 1.9.3 routes, limits and errors) without a GPU."""
    ready_file = options.pop("ready_file")
    if options.pop("no_auto_truncate"):
        options["auto_truncate"] = False
    try:
        config = config_from_options(**options)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        from teibatch.server.runner import run_server  # the web server's imports, only for `serve`

        code = run_server(config, ready_file=ready_file)
    except ImportError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    sys.exit(code)
