"""The numpy BERT encoder on a tiny random model: masking, pooling, and agreement with transformers."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from teibatch.server.backends.bert_encoder import BertConfig, BertEncoder, _gelu, l2_normalize, pool

TINY = {"model_type": "bert", "hidden_act": "gelu", "hidden_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
        "layer_norm_eps": 1e-12, "vocab_size": 20, "type_vocab_size": 2}


def tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with the names (and shapes) of a Hugging Face BertModel's safetensors file."""
    rng = np.random.default_rng(seed)
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]

    def rand(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    tensors = {"embeddings.word_embeddings.weight": rand(TINY["vocab_size"], h),
               "embeddings.position_embeddings.weight": rand(TINY["max_position_embeddings"], h),
               "embeddings.token_type_embeddings.weight": rand(2, h),
               "embeddings.LayerNorm.weight": 1 + rand(h), "embeddings.LayerNorm.bias": rand(h)}
    for i in range(TINY["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            tensors[f"{p}attention.self.{name}.weight"] = rand(h, h)
            tensors[f"{p}attention.self.{name}.bias"] = rand(h)
        tensors.update({
            f"{p}attention.output.dense.weight": rand(h, h), f"{p}attention.output.dense.bias": rand(h),
            f"{p}attention.output.LayerNorm.weight": 1 + rand(h), f"{p}attention.output.LayerNorm.bias": rand(h),
            f"{p}intermediate.dense.weight": rand(inter, h), f"{p}intermediate.dense.bias": rand(inter),
            f"{p}output.dense.weight": rand(h, inter), f"{p}output.dense.bias": rand(h),
            f"{p}output.LayerNorm.weight": 1 + rand(h), f"{p}output.LayerNorm.bias": rand(h),
        })
    return tensors


@pytest.fixture(scope="module")
def encoder() -> BertEncoder:
    return BertEncoder(BertConfig.from_json(TINY), tiny_tensors())


def test_padding_does_not_change_the_hidden_states(encoder: BertEncoder) -> None:
    ids = np.array([[1, 5, 7, 2]])
    alone = encoder.forward(ids, np.ones_like(ids))
    padded_ids = np.array([[1, 5, 7, 2, 9, 9, 3]])  # junk ids under a zero mask
    padded = encoder.forward(padded_ids, np.array([[1, 1, 1, 1, 0, 0, 0]]))
    np.testing.assert_allclose(padded[:, :4], alone, atol=1e-5)


def test_a_sequence_is_computed_the_same_alone_and_in_a_batch(encoder: BertEncoder) -> None:
    ids = np.array([[1, 4, 2, 0, 0], [1, 6, 8, 3, 2]])
    mask = (np.arange(5) < np.array([[3], [5]])).astype(np.int64)
    batch = encoder.forward(ids, mask)
    np.testing.assert_allclose(batch[0, :3], encoder.forward(ids[:1, :3], mask[:1, :3])[0], atol=1e-5)
    np.testing.assert_allclose(batch[1], encoder.forward(ids[1:], mask[1:])[0], atol=1e-5)


def test_more_tokens_than_positions_are_refused(encoder: BertEncoder) -> None:
    ids = np.ones((1, 17), dtype=np.int64)
    with pytest.raises(ValueError, match="17 tokens exceed the model's 16 positions"):
        encoder.forward(ids, ids)


def test_mean_pooling_ignores_padding_and_cls_takes_the_first_token() -> None:
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool(hidden, mask, "mean"), [[2.0, 3.0]])
    np.testing.assert_allclose(pool(hidden, mask, "cls"), [[1.0, 2.0]])
    with pytest.raises(ValueError, match="pooling must be one of"):
        pool(hidden, mask, "max")


def test_l2_normalize_gives_unit_rows_and_keeps_zero_rows() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
    assert out.dtype == np.float32


def test_gelu_is_the_exact_erf_gelu() -> None:
    x = np.linspace(-6, 6, 2001, dtype=np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(_gelu(x) - exact).max() < 1e-6


@pytest.mark.parametrize(("change", "message"), [
    pytest.param({"model_type": "roberta"}, "is not bert", id="model-type"),
    pytest.param({"hidden_act": "relu"}, "only gelu", id="activation"),
    pytest.param({"position_embedding_type": "relative_key"}, "absolute", id="positions"),
    pytest.param({"num_attention_heads": 3}, "multiple of num_attention_heads", id="heads"),
])
def test_unsupported_configs_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BertConfig.from_json({**TINY, **change})


def test_weights_with_a_bert_prefix_load_and_a_missing_tensor_is_named(encoder: BertEncoder) -> None:
    prefixed = BertEncoder(encoder.config, {f"bert.{k}": v for k, v in tiny_tensors().items()})
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(prefixed.forward(ids, np.ones_like(ids)), encoder.forward(ids, np.ones_like(ids)))
    tensors = tiny_tensors()
    del tensors["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.bias"):
        BertEncoder(encoder.config, tensors)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="torch and transformers not installed (extra 'st'): the reference implementation")
def test_hidden_states_match_transformers_bert(encoder: BertEncoder) -> None:
    import torch
    import transformers

    model = transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=False)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tiny_tensors().items()}, strict=True)
    model.eval()
    ids = np.array([[1, 4, 9, 2, 0, 0], [1, 6, 8, 3, 5, 2]])
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        reference = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    ours = encoder.forward(ids, mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(ours[keep], reference.numpy()[keep], atol=1e-4)
