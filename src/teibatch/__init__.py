"""teibatch: batch embedding jobs on Text Embeddings Inference servers, sharded with Ray, into Parquet."""

__version__ = "0.1.0"

__all__ = ["__version__"]
