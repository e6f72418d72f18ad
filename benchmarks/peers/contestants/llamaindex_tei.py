"""LlamaIndex: ``TextEmbeddingsInference(...).get_text_embedding_batch(texts)``.

As the LlamaIndex TEI notebook shows it: ``model_name`` (required "for formatting inference text"),
``timeout=60``, ``embed_batch_size=10``; the ``32`` variant sets ``embed_batch_size`` to TEI's limit.
With ``features`` on (the probe), ``embeddings_cache`` holds a ``SimpleKVStore`` loaded from and
persisted to the state folder, the cache ``BaseEmbedding`` offers.
"""

from __future__ import annotations

from contestants.common import Config, main, read_documents, write_vectors


def run(config: Config) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    ids, texts = read_documents(config.corpus)
    cache = None
    cache_path = config.state / "embeddings_cache.json"
    if config.features:
        from llama_index.core.storage.kvstore import SimpleKVStore

        cache = SimpleKVStore.from_persist_path(str(cache_path)) if cache_path.exists() else SimpleKVStore()
    embed_model = TextEmbeddingsInference(
        model_name=config.model,
        base_url=config.urls[0],
        timeout=60,
        embed_batch_size=32 if config.variant == "batch32" else 10,
        auth_token=config.api_key,
    )
    if cache is not None:
        embed_model.embeddings_cache = cache
    vectors = embed_model.get_text_embedding_batch(texts)
    if cache is not None:
        cache.persist(str(cache_path))
    write_vectors(config, ids, vectors)


if __name__ == "__main__":
    main(run)
