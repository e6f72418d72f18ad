"""What writing vectors to Parquet costs, for vectors like a model's and for a few repeated ones.

The one-process floor (``bench_cpu.py --floor``) answers every request with the same canned
vectors, so its Parquet parts repeat 32 vectors over and over, which zstd shrinks to a few percent
of their size at little cost. A model's vectors do not repeat and barely compress. This prints the
CPU per vector of teibatch's own part writer (``sink/parts.py``: same schema and encoding options)
for both kinds of vectors, with and without compression, so the floor's figure can be read for
what it leaves out.

    python benchmarks/bench_parquet.py                 # 384 and 1024 dimensions, 100,000 vectors
    python benchmarks/bench_parquet.py --dims 768 --vectors 50000
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np

from teibatch.sink.parts import VectorSchema, WriteOptions, vectors_table, write_part_to

CANNED = 32  # the floor's server answers each 32-input request with the same 32 vectors


def vectors(count: int, dimension: int, repeated: bool) -> np.ndarray:
    """``count`` unit vectors: all different, or the first ``CANNED`` repeated (the floor's)."""
    rng = np.random.default_rng(0)
    distinct = CANNED if repeated else count
    matrix = rng.standard_normal((distinct, dimension)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.tile(matrix, (-(-count // distinct), 1))[:count] if repeated else matrix


def cpu_per_vector(matrix: np.ndarray, compression: str, repeat: int) -> tuple[float, float]:
    """The least CPU µs per vector over ``repeat`` writes, and the part's size over the raw floats'."""
    count, dimension = matrix.shape
    schema = VectorSchema(dimension=dimension)
    table = vectors_table(schema, [f"doc-{i}" for i in range(count)], matrix, ["0" * 32] * count, {})
    best, size = float("inf"), 0
    for _ in range(repeat):
        sink = io.BytesIO()
        started = time.process_time()
        write_part_to(sink, table, WriteOptions(compression=compression))
        best = min(best, time.process_time() - started)
        size = sink.tell()
    return best * 1e6 / count, size / matrix.nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="384,1024", help="comma-separated dimensions")
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| dims | vectors | compression | CPU µs per vector | part size / raw floats |")
    print("|---|---|---|---|---|")
    for dimension in (int(d) for d in args.dims.split(",")):
        for label, repeated in (("a model's (all different)", False), (f"the floor's ({CANNED} repeated)", True)):
            matrix = vectors(args.vectors, dimension, repeated)
            for compression in ("zstd", "none"):
                micros, ratio = cpu_per_vector(matrix, compression, args.repeat)
                print(f"| {dimension} | {label} | {compression} | {micros:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
