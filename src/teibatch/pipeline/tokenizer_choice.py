"""Which token rule the chunker counts with (``chunking.tokenizer``): the servers' own, found once
in the driver and carried to every shard task as a :class:`~teibatch.pipeline.chunks.CounterSource`.

``chunking.tokenizer: PATH`` (a tokenizer.json, or a folder holding one) is used as given,
``builtin-hashing`` is the built-in server's hashing rule (for built-in servers reached as ``static``
under another model name); with ``strategy: chars`` no tokenizer is used. ``auto`` tries, in order,
each of :data:`AUTO_SOURCES`:

1. the built-in server's own rule, when the servers are built-in: its ``hashing`` backend counts
   with :class:`~teibatch.corpus.ApproxTokenCounter` (also for a ``teibatch/hashing-*`` model any
   provider reaches), its ``numpy`` and ``sentence-transformers`` backends with their model's
   tokenizer.json (the packaged one, ``corpus/tokenizer_files.py``);
2. the model's tokenizer.json in the Hugging Face caches, the local servers' volume and a local
   ``export.import_from`` folder (:func:`~teibatch.corpus.find_tokenizer_file`);
3. the servers' own ``/tokenize`` route (:class:`~teibatch.tei.tokenize.RouteTokenCounter`, built
   by each shard task over the run's endpoints): exact for any model, at the price of requests to
   the servers. It needs the servers, so it is there only once they are met (``route``); before
   (``teibatch plan``, or the driver's choice before the servers start) it is not.

When none gives a rule, :class:`~teibatch.errors.TokenizerUnavailable` names what was tried.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from teibatch.corpus import find_tokenizer_file
from teibatch.corpus.token_count import require_tokenizers
from teibatch.errors import TokenizerUnavailable
from teibatch.fleet.providers.local import BACKEND_FLAG as BUILTIN_BACKEND_FLAG
from teibatch.fleet.providers.local import DEFAULT_BACKEND as BUILTIN_DEFAULT_BACKEND
from teibatch.fleet.providers.local import server_flag
from teibatch.job import JobSpec
from teibatch.pipeline.chunks import (
    COUNTER_CHARS,
    COUNTER_FILE,
    COUNTER_HASHING,
    COUNTER_ROUTE,
    CounterSource,
    TokenizeRoute,
)
from teibatch.pipeline.fleet_from_job import BUILTIN_MODEL_PREFIX, local_engine

HASHING_MODEL_PREFIX = f"{BUILTIN_MODEL_PREFIX}hashing"

CHARS = CounterSource(COUNTER_CHARS, "characters (strategy: chars)")
HASHING = CounterSource(COUNTER_HASHING, "builtin-hashing")
ROUTE_LABEL = "the servers' /tokenize route"

Source = Callable[[JobSpec, "str | None", list[str], "TokenizeRoute | None"], "CounterSource | None"]


def choose_counter(job: JobSpec, model_id: str | None, route: TokenizeRoute | None = None) -> CounterSource:
    """The token rule ``job`` chunks with, for servers serving ``model_id`` (the job's, or what the
    servers report) and reached through ``route`` once they are met; :class:`TokenizerUnavailable`
    (exit 2) when ``auto`` finds none (only possible without ``route``)."""
    chunking = job.chunking
    if chunking.strategy == "chars":
        return CHARS
    if chunking.tokenizer == HASHING.label:
        return HASHING
    if chunking.tokenizer != "auto":
        return _from_file(find_tokenizer_file(path=chunking.tokenizer))
    tried: list[str] = []
    for source in AUTO_SOURCES:
        found = source(job, model_id, tried, route)
        if found is not None:
            return found
    raise TokenizerUnavailable(
        f"chunking needs the servers' tokenizer to count tokens, and none was found for model {model_id!r} "
        f"(tried: {'; '.join(tried)}); set chunking.tokenizer to the model's tokenizer.json or its folder, "
        "or chunking.strategy: chars to count characters instead", tried=tuple(tried), key="chunking.tokenizer")


def _builtin_rule(job: JobSpec, model_id: str | None, tried: list[str],
                  _: TokenizeRoute | None) -> CounterSource | None:
    """The built-in server's rule: hashing, or its real model's packaged tokenizer."""
    if model_id is not None and model_id.startswith(HASHING_MODEL_PREFIX):
        return HASHING
    if job.servers.provider != "local" or local_engine(job.servers, job.model.id) != "builtin":
        tried.append("not the built-in server")
        return None
    backend = server_flag(job.servers.server_args, BUILTIN_BACKEND_FLAG) or BUILTIN_DEFAULT_BACKEND
    if backend == BUILTIN_DEFAULT_BACKEND:
        return HASHING
    try:
        return _from_file(find_tokenizer_file(model_id))
    except TokenizerUnavailable as exc:
        tried.append(f"the built-in {backend} backend's model: {exc}")
        return None


def _model_file(job: JobSpec, model_id: str | None, tried: list[str],
                _: TokenizeRoute | None) -> CounterSource | None:
    """The model's tokenizer.json in the caches, the local servers' volume, a local export to import."""
    if not model_id:
        tried.append("no model id to look a tokenizer up by (set model.id)")
        return None
    folders = [folder for folder in (job.servers.volume, job.export.import_from)
               if folder and "://" not in folder and Path(folder).is_dir()]
    try:
        return _from_file(find_tokenizer_file(model_id, cache_dirs=folders))
    except TokenizerUnavailable as exc:
        tried.extend(exc.tried or (str(exc),))
        return None


def _servers_route(job: JobSpec, model_id: str | None, tried: list[str],
                   route: TokenizeRoute | None) -> CounterSource | None:
    """The servers' ``/tokenize``, once they are met."""
    if route is None:
        tried.append("the servers' /tokenize route (the servers are not met yet)")
        return None
    return CounterSource(COUNTER_ROUTE, ROUTE_LABEL, route=route)


AUTO_SOURCES: tuple[Source, ...] = (_builtin_rule, _model_file, _servers_route)
"""What ``tokenizer: auto`` tries, in order (see the module docstring)."""


def _from_file(path: Path) -> CounterSource:
    """A source over the tokenizer.json at ``path``; :class:`TokenizerUnavailable` if it cannot be read."""
    try:
        config = path.read_text(encoding="utf-8")
        require_tokenizers().Tokenizer.from_str(config)
    except ImportError as exc:
        raise TokenizerUnavailable(str(exc)) from exc
    except Exception as exc:  # the Rust side raises a bare Exception for a file it cannot parse
        raise TokenizerUnavailable(f"cannot read {path} as a tokenizer: {exc}", tried=(str(path),)) from exc
    return CounterSource(COUNTER_FILE, f"tokenizer.json at {path}", config)
