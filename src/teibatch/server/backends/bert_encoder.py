"""A BERT encoder in plain numpy, float32: the forward pass of a sentence-embedding model.

Enough of BERT for Sentence Transformers models such as all-MiniLM-L6-v2 (6 layers, 384 hidden,
12 heads): absolute position embeddings, post-LayerNorm blocks, exact (erf) GELU, then mean or CLS
pooling. It needs numpy only; reading the weights (safetensors) and tokenizing live in
:mod:`teibatch.server.backends.numpy_bert`.

A batch is padded to its longest sequence; padded keys get an additive bias of -1e9 before the
softmax, so their attention weight is exactly 0 and a text's vector does not depend on the padding
or on the other texts of its batch (beyond float rounding in the matrix products, ~1e-7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

POOLINGS = ("mean", "cls")
_MASKED = np.float32(-1e9)

# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below float32's resolution near 1.
_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT model, from its ``config.json``."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BertConfig:
        """Read a Hugging Face ``config.json``; ValueError for anything this encoder cannot run."""
        if raw.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type {raw.get('model_type')!r} is not bert")
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act {raw.get('hidden_act')!r} is not supported (only gelu)")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        config = cls(hidden_size=int(raw["hidden_size"]), num_layers=int(raw["num_hidden_layers"]),
                     num_heads=int(raw["num_attention_heads"]), intermediate_size=int(raw["intermediate_size"]),
                     max_position_embeddings=int(raw["max_position_embeddings"]),
                     layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)))
        if config.hidden_size % config.num_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        return config


@dataclass(frozen=True)
class _Layer:
    qkv_w: np.ndarray  # (hidden, 3 * hidden): query, key, value side by side
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    up_w: np.ndarray
    up_b: np.ndarray
    down_w: np.ndarray
    down_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray


class BertEncoder:
    """BERT's forward pass over token ids; weights as a ``name → array`` mapping (safetensors' names).

    Linear weights are stored transposed once at load (``x @ W``), and each layer's query, key and
    value projections are fused into one product.
    """

    def __init__(self, config: BertConfig, tensors: Mapping[str, np.ndarray]) -> None:
        self.config = config
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def get(name: str) -> np.ndarray:
            try:
                return np.ascontiguousarray(tensors[prefix + name], dtype=np.float32)
            except KeyError:
                raise ValueError(f"the weights have no tensor {prefix + name!r}") from None

        def linear(name: str) -> np.ndarray:
            return np.ascontiguousarray(get(name + ".weight").T)

        self.word = get("embeddings.word_embeddings.weight")
        self.position = get("embeddings.position_embeddings.weight")
        self.token_type = get("embeddings.token_type_embeddings.weight")[0]
        self.emb_ln = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(config.num_layers):
            p = f"encoder.layer.{i}."
            att = p + "attention.self."
            self.layers.append(_Layer(
                qkv_w=np.ascontiguousarray(np.concatenate(
                    [linear(att + "query"), linear(att + "key"), linear(att + "value")], axis=1)),
                qkv_b=np.concatenate([get(att + "query.bias"), get(att + "key.bias"), get(att + "value.bias")]),
                out_w=linear(p + "attention.output.dense"), out_b=get(p + "attention.output.dense.bias"),
                ln1_w=get(p + "attention.output.LayerNorm.weight"), ln1_b=get(p + "attention.output.LayerNorm.bias"),
                up_w=linear(p + "intermediate.dense"), up_b=get(p + "intermediate.dense.bias"),
                down_w=linear(p + "output.dense"), down_b=get(p + "output.dense.bias"),
                ln2_w=get(p + "output.LayerNorm.weight"), ln2_b=get(p + "output.LayerNorm.bias"),
            ))
        if self.word.shape[1] != config.hidden_size:
            raise ValueError(f"word embeddings have width {self.word.shape[1]}, config says {config.hidden_size}")

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Last hidden states, float32 ``(batch, length, hidden)``, for int ``ids`` and 0/1 ``mask``.

        Both arrays are ``(batch, length)``; rows are padded on the right where ``mask`` is 0.
        """
        cfg = self.config
        batch, length = ids.shape
        if length > cfg.max_position_embeddings:
            raise ValueError(f"{length} tokens exceed the model's {cfg.max_position_embeddings} positions")
        heads, width = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        x = self.word[ids] + self.position[:length] + self.token_type
        x = _layer_norm(x.reshape(batch * length, cfg.hidden_size), *self.emb_ln, cfg.layer_norm_eps)
        bias = np.where(mask[:, None, None, :] > 0, np.float32(0), _MASKED).astype(np.float32)
        scale = np.float32(1.0 / math.sqrt(width))
        for layer in self.layers:
            qkv = (x @ layer.qkv_w + layer.qkv_b).reshape(batch, length, 3, heads, width)
            # (batch, heads, length, width) each, contiguous: numpy hands such stacks to BLAS whole.
            q, k, v = np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4))
            q *= scale
            scores = q @ k.transpose(0, 1, 3, 2)
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            # Softmax's division is done on the (length x width) context, not the (length x length) weights.
            context = scores @ v
            context /= scores.sum(axis=-1, keepdims=True)
            context = context.transpose(0, 2, 1, 3).reshape(batch * length, cfg.hidden_size)
            x = _layer_norm(context @ layer.out_w + layer.out_b + x, layer.ln1_w, layer.ln1_b, cfg.layer_norm_eps)
            hidden = _gelu(x @ layer.up_w + layer.up_b)
            x = _layer_norm(hidden @ layer.down_w + layer.down_b + x, layer.ln2_w, layer.ln2_b, cfg.layer_norm_eps)
        return x.reshape(batch, length, cfg.hidden_size)


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Sentence vectors ``(batch, hidden)``: the mean over unmasked tokens, or the first ([CLS]) token."""
    if mode == "cls":
        return np.ascontiguousarray(hidden[:, 0])
    if mode != "mean":
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {mode!r}")
    weights = mask.astype(np.float32)[:, :, None]
    summed = (hidden * weights).sum(axis=1)
    return summed / np.maximum(weights.sum(axis=1), np.float32(1e-9))


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero), like ``torch.nn.functional.normalize``."""
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
    return (vectors / np.maximum(norms, np.float32(1e-12))[:, None]).astype(np.float32)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.einsum("ij,ij->i", centered, centered)[:, None] / np.float32(x.shape[-1])
    return centered / np.sqrt(variance + np.float32(eps)) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, ``x * (1 + erf(x / sqrt 2)) / 2``, with erf from A&S 7.1.26, mostly in place.

    With ``q = poly(t) * exp(-z²)`` (so that ``erf(z) = 1 - q`` for ``z = |x| / sqrt 2``), GELU is
    ``x * (1 - q/2)`` for ``x >= 0`` and ``x * q/2`` below.
    """
    z = np.abs(x)
    z *= np.float32(1.0 / math.sqrt(2.0))
    t = z * _ERF_P
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = _ERF_A
    q = t * a5
    for a in (a4, a3, a2, a1):
        q += a
        q *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    q *= z
    q *= np.float32(0.5)
    half = np.where(x >= 0, np.float32(1.0) - q, q)
    half *= x
    return half
