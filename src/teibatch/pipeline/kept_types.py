"""The output's kept-field types for a run: the ones its manifest records, or decided now and recorded.

Every part of an output must give each kept field the same type, in this run and every later one,
so the types are decided once (``corpus/kept.py``) before the first shard of an output is written,
and kept in ``_manifest.json``. Then:

* an output whose manifest records them keeps them, whatever the corpus's first records hold now;
* an output written before they were recorded keeps behaving as ``keep_fields_types: stringify``;
* a job that asks for ``stringify`` on an output whose recorded types it would change (a field
  written as int64 would become text) is refused: that output cannot hold both (``OutputMismatch``);
* an output with no committed shard has nothing to keep: its types are decided again.
"""

from __future__ import annotations

from collections.abc import Sequence

from teibatch.corpus import KeptFields, Shard
from teibatch.corpus.kept import check_columns, decide_kept_fields, type_name
from teibatch.corpus.probe import CorpusProbe
from teibatch.corpus.records import KEEP_FIELDS_STRICT, KEEP_FIELDS_STRINGIFY
from teibatch.errors import OutputMismatch
from teibatch.job import JobSpec
from teibatch.pipeline.progress import Reporter
from teibatch.sink import Manifest


def output_kept_fields(job: JobSpec, probe: CorpusProbe, shards: Sequence[Shard], manifest: Manifest, url: str,
                       reporter: Reporter) -> KeptFields | None:
    """The kept-field types this run writes (``None`` when the job keeps no field); records them in ``manifest``.

    Says once per field, through ``reporter`` (the run's lines and its report), which fields a
    fresh ``strict`` output writes as text because their values disagree in type. Raises
    ``OutputMismatch`` (module doc) and ``CorpusMismatch`` for a Parquet column the recorded types
    cannot hold.
    """
    options = job.corpus_options()
    if not options.keep_fields:
        return None
    files = [path for shard in shards for path in shard.sources]
    wanted = options.keep_fields_types

    def decide(rule: str, *, report_stringified: bool = False) -> KeptFields:
        kept, stringified = decide_kept_fields(options, rule, probe.kept, probe.sample_file, files)
        if report_stringified:
            for field in stringified:
                reporter.message(field.message(), event="kept_field_stringified", field=field.field,
                                 types=list(field.seen))
        return kept

    if not manifest.shards:
        kept = decide(wanted, report_stringified=True)
    elif manifest.kept_fields is None:  # written before kept-field types were recorded
        kept = decide(KEEP_FIELDS_STRINGIFY)
    else:
        kept = KeptFields.from_json(manifest.kept_fields)
        if kept.rule == KEEP_FIELDS_STRICT and wanted == KEEP_FIELDS_STRINGIFY:
            _refuse_other_types(kept, decide(wanted), url)
        check_columns(kept, options, files)
    if kept.rule != wanted and kept.stringified:
        typed = decide(wanted)
        fields = [name for name in kept.stringified if name not in typed.stringified]
        if fields:
            reporter.message(f"kept field(s) {', '.join(fields)} stay JSON text in {url}, as it was first written "
                             "with corpus.keep_fields_types: stringify; write to a new output.path to keep their "
                             "types", event="kept_fields_stay_text", fields=fields)
    manifest.kept_fields = kept.to_json()
    return kept


def _refuse_other_types(recorded: KeptFields, wanted: KeptFields, url: str) -> None:
    changed = [name for name in recorded.types
               if (name in recorded.stringified, recorded.types[name]) != (name in wanted.stringified,
                                                                          wanted.types[name])]
    if not changed:
        return
    name = changed[0]
    raise OutputMismatch(
        f"{url} holds kept field {name!r} as {type_name(recorded.types[name])} (corpus.keep_fields_types: strict); "
        f"keep_fields_types: stringify would write it as JSON text, and one output cannot hold both. Write to a "
        "new output.path, or delete the old output first")
