"""The calibration of an ``int8``/``uint8`` output: per-dimension ranges taken once, before any shard runs.

Every vector of an output, and every query its user quantizes (``teibatch.quantize``), must use the
same ranges, so they are fixed before the first shard task starts and kept in the manifest:

* an output's first run has the driver embed the corpus's first
  :data:`~teibatch.quantize.DEFAULT_CALIBRATION_TEXTS` texts (chunks, with chunking) in plan order,
  through the run's senders, and takes each dimension's min and max over their vectors; these texts
  are embedded again by their shards (their vectors are not kept here);
* every later run — a resume, an incremental run, a run over a grown corpus — takes the ranges
  from the manifest and embeds nothing for them.

``binary`` needs no calibration (the sign of each value); its rule is recorded all the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from itertools import islice

import numpy as np

from teibatch.corpus import CorpusOptions, Document, Shard, read_shard
from teibatch.errors import CorpusMismatch, SinkError
from teibatch.pipeline.chunks import ChunkPlan, Units
from teibatch.pipeline.progress import Reporter
from teibatch.pipeline.senders.plans import SenderRef
from teibatch.pipeline.senders.sending import embedded_in_order
from teibatch.quantize import DEFAULT_CALIBRATION_TEXTS, FLOAT_TYPES, Quantization
from teibatch.sink import Manifest

log = logging.getLogger(__name__)

# Before every shard task's chunks in the senders (their priority is their start time).
CALIBRATION_PRIORITY = 0.0


def output_quantization(vector_type: str, manifest: Manifest, shards: Sequence[Shard], corpus: CorpusOptions,
                        chunking: ChunkPlan | None, senders: Sequence[SenderRef], reporter: Reporter) -> Quantization:
    """How this run stores its vectors: the manifest's quantization when it has one, else a new one
    (calibrated on the first :data:`DEFAULT_CALIBRATION_TEXTS` texts of ``shards`` when ``vector_type``
    needs it), which is recorded in ``manifest`` (saved with the first commit)."""
    if vector_type in FLOAT_TYPES:
        return Quantization(vector_type)
    if manifest.quantization is not None:
        stored = Quantization.from_json(manifest.quantization)
        if stored.vector_type == vector_type:  # else left from options an emptied output no longer has
            return stored
    if vector_type == "binary":
        quantization = Quantization(vector_type)
    elif any(entry.rows for entry in manifest.shards.values()):
        raise SinkError(f"the output holds {vector_type} vectors but its manifest keeps no calibration "
                        "(quantization); restore the manifest, or write to a new output.path")
    else:
        started = time.monotonic()
        quantization = Quantization.calibrate(vector_type, _sample_vectors(_texts(corpus, shards, chunking), senders))
        reporter.message(f"{vector_type} ranges calibrated on the first {quantization.sample} texts "
                         f"in {time.monotonic() - started:.1f}s", event="calibrated", vector_type=vector_type,
                         texts=quantization.sample)
    manifest.quantization = quantization.to_json()
    return quantization


def _sample_vectors(texts: Iterator[str], senders: Sequence[SenderRef]) -> np.ndarray:
    """The vectors of the first :data:`DEFAULT_CALIBRATION_TEXTS` texts the servers embed (more are read only
    while none did)."""
    while batch := list(islice(texts, DEFAULT_CALIBRATION_TEXTS)):
        vectors = [result.vectors[result.ok] for _, result in
                   embedded_in_order(batch, senders, priority=CALIBRATION_PRIORITY)]
        found = np.concatenate(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)
        if len(found):
            return found
    raise CorpusMismatch("no text of the corpus could be embedded, so there is nothing to calibrate the "
                         "quantized vectors on; see the servers' errors above, or check corpus.text_field")


def _texts(corpus: CorpusOptions, shards: Sequence[Shard], chunking: ChunkPlan | None) -> Iterator[str]:
    """The corpus's texts to send, in plan order: each document's, or each of its chunks' with chunking.

    A shard that cannot be read is passed over: its own task meets the same error and reports it.
    """
    for shard in shards:
        try:
            documents = (item for item in read_shard(corpus, shard) if isinstance(item, Document))
            for _, text in Units(chunking, hash_options={}).expand(documents, [], []):  # hashes unused
                yield text
        except Exception as exc:
            log.debug("shard %s left out of the calibration: %s", shard.id, exc)
