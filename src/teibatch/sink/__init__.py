"""The output: Parquet parts written all or nothing, the manifest, and run reports."""

from teibatch.sink.id_repeats import check_output_ids
from teibatch.sink.lock import LOCK, LockHolder, OutputLock
from teibatch.sink.manifest import MANIFEST, Manifest, ShardEntry, remove_stale, remove_uncommitted_temp
from teibatch.sink.parts import (
    DOCUMENTS_DIR,
    REJECTS_DIR,
    VECTORS_DIR,
    VectorSchema,
    VectorsPart,
    WriteOptions,
    documents_table,
    part_metadata,
    read_vectors,
    rejects_table,
    vectors_table,
    warm_up,
    write_part,
)
from teibatch.sink.presence import PartCheck, check_parts
from teibatch.sink.replace import Replacements
from teibatch.sink.report import RUNS_DIR, RunChoice, choose_run, latest_report, run_ids, write_report
from teibatch.sink.status import output_status
from teibatch.sink.store import OutputStore

__all__ = [
    "DOCUMENTS_DIR",
    "LOCK",
    "MANIFEST",
    "REJECTS_DIR",
    "RUNS_DIR",
    "VECTORS_DIR",
    "LockHolder",
    "Manifest",
    "OutputLock",
    "OutputStore",
    "PartCheck",
    "Replacements",
    "RunChoice",
    "ShardEntry",
    "VectorSchema",
    "VectorsPart",
    "WriteOptions",
    "check_output_ids",
    "check_parts",
    "choose_run",
    "documents_table",
    "latest_report",
    "output_status",
    "part_metadata",
    "read_vectors",
    "rejects_table",
    "remove_stale",
    "remove_uncommitted_temp",
    "run_ids",
    "vectors_table",
    "warm_up",
    "write_part",
    "write_report",
]
