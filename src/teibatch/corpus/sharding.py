"""Cut a corpus into deterministic shards, and stream one shard's documents.

Row formats (JSON lines, JSON, CSV, Parquet, builtins) are cut per file into ranges of
``shard_docs`` rows, so a shard never spans files; one-document-per-file ``text`` sources are cut
from the sorted file list into groups of ``shard_docs`` files. A shard's id digests what decides its
content (its sources' relative paths and fingerprints, the range, the format and the reading options),
so planning twice gives the same ids, a changed file changes only its own shards' ids, and a shard
committed by an earlier run can be recognised and skipped.

Planning streams each row file once to count its records (Parquet reads only its footer); nothing
of the corpus is held in memory. In an uncompressed JSON-lines file it notes where each shard's
first row begins (``Shard.mark``), so that a shard's reading starts there. A file that cannot be
read to its end (``CorpusMismatch`` while counting) does not stop the plan: with ``on_bad_file:
fail`` it gets one shard carrying the problem (``Shard.bad_file``), and reading that shard raises
it, so the other files' shards still run and a run after the file is fixed (a new fingerprint, a
new shard id) completes. With ``reject`` it is counted with its ``Malformed`` rows and sharded like
any other file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence

import orjson

from teibatch.corpus.documents import DocumentRules, IdSeen, repeated_id
from teibatch.corpus.formats import FileFormat, detect_format
from teibatch.corpus.kept import KeptFields
from teibatch.corpus.listing import (
    CorpusRoot,
    Listing,
    SourceFile,
    fingerprint,
    list_corpus,
    list_sources,
    resolve_root,
)
from teibatch.corpus.readers import can_mark, count_and_mark, count_rows, iter_rows, read_text
from teibatch.corpus.records import REJECT_DUPLICATE_ID, BadFile, CorpusOptions, Document, Reject, RowMark, Shard
from teibatch.corpus.rows import Place
from teibatch.errors import CorpusError, CorpusMismatch

SHARD_ID_HEX = 16
SHARD_ID_VERSION = 2
"""Bumped when the reading rules change what a shard yields, so old shard ids stop matching.
2: the id rule (a missing, empty, null or non-integer id is a reject) and strict CSV quoting."""


def plan_shards(options: CorpusOptions, listing: Listing | None = None) -> list[Shard]:
    """List the corpus and cut it into shards, in a fixed order; ``CorpusError`` if it cannot be read.

    ``listing``: the corpus as the caller already listed it (:func:`list_corpus`), else it is listed here.

    Shards follow the sorted file list (a group of text files is a run of consecutive files), so
    reading them in order reads the corpus in order. Every file's format is decided before any file
    is read, so an unknown extension fails at once.
    """
    if options.shard_docs < 1:
        raise CorpusError(f"corpus.shard_docs must be at least 1, not {options.shard_docs}")
    listing = listing or list_corpus(options)
    root, sources = listing.root, listing.files
    formats = [detect_format(source.path, options.format) for source in sources]
    shards: list[Shard] = []
    done = 0  # text files already in shards: a text shard's start
    runs = itertools.groupby(zip(sources, formats, strict=True), key=lambda pair: pair[1].name == "text")
    for text, run in runs:
        if text:  # a run of consecutive text files, cut every shard_docs files
            files = [source for source, _ in run]
            for first in range(0, len(files), options.shard_docs):
                shards.append(_shard(options, files[first:first + options.shard_docs], done + first, "text"))
            done += len(files)
            continue
        for source, fmt in run:
            marks: dict[int, RowMark] = {}
            try:
                if can_mark(fmt):
                    rows, marks = count_and_mark(root.fs, source.url, fmt, source.path, options.shard_docs)
                else:
                    rows = count_rows(root.fs, source.url, fmt, source.path, options.on_bad_file)
            except CorpusMismatch as exc:
                shards.append(_shard(options, [source], 0, fmt.name, 0, BadFile.from_error(source.path, exc)))
                continue
            for start in range(0, rows, options.shard_docs):
                stop = min(start + options.shard_docs, rows)
                shards.append(_shard(options, [source], start, fmt.name, stop, mark=marks.get(start)))
    return shards


def read_shard(options: CorpusOptions, shard: Shard, *, verify: bool = True,
               kept: KeptFields | None = None,
               duplicates: Mapping[int, IdSeen] | None = None) -> Iterator[Document | Reject]:
    """Stream the shard's documents and rejects in source order, exactly ``shard.size`` of them.

    With ``verify`` (the default) each source's fingerprint is read again first and the shard id
    recomputed: a corpus changed since planning raises ``CorpusError`` instead of yielding content
    that no longer matches the id. A second document with an id already seen in this shard is
    rejected as a duplicate; its detail names both records and, when one held the id as an integer
    and the other as a string, both types.

    ``duplicates``: the shard's documents whose id an earlier shard holds, by position in the shard
    (0 is its first row), each with where that id is kept (``pipeline/unique_ids.py``); each is
    rejected as a duplicate naming both places.

    ``kept``: the output's kept-field types (``kept.py``); a value that does not fit raises
    ``CorpusMismatch``, stopping this shard. Without it, values are as ``stringify`` has them.

    A shard planned for a bad file (``shard.bad_file``) raises its ``CorpusMismatch`` (exit code
    2, naming the file and line) before yielding anything; with ``on_bad_file: fail`` a file found
    bad only while reading (a Parquet page, a compressed text file) raises the same way. Either
    stops this shard only: the caller may go on with the others.
    """
    root = resolve_root(options)
    if verify:
        _verify(options, root, shard)
    if shard.bad_file is not None:
        raise shard.bad_file.error()
    rules = DocumentRules.for_format(options, shard.format, kept)
    seen: dict[str, tuple[int | None, int | None, bool]] = {}  # a tuple per id: a shard may hold millions
    count = 0
    for path, row, line, item, integer in _items(options, root, shard, rules):
        count += 1
        if isinstance(item, Document):
            before = duplicates.get(count - 1) if duplicates is not None else None  # kept by an earlier shard
            if before is None:
                here = (row, line, integer)
                first = seen.setdefault(item.id, here)
                before = None if first is here else IdSeen(Place(path, first[0], first[1]), first[2])
            if before is not None:
                place = Place(path, row, line)
                detail = repeated_id(item.id, before, IdSeen(place, integer))
                item = Reject(item.id, REJECT_DUPLICATE_ID, f"{place}: {detail}")
        yield item
    if count != shard.size:
        raise CorpusError(f"{', '.join(shard.sources)}: shard {shard.id} should hold {shard.size} rows "
                          f"but {count} were read; the corpus changed since planning, plan again")


def read_ids(options: CorpusOptions, shard: Shard) -> Iterator[tuple[int, str, str, int | None, int | None, bool]]:
    """The documents of ``shard`` as ``(position in the shard, id, text, row, line, integer id?)``, in
    order (``row`` and ``line`` as ``rows.Place`` has them).

    A row that :func:`read_shard` would reject for what it holds (no id, no text) is left out: only
    documents hold ids. Kept fields are not read, and the shard is not verified (its id digests its
    sources' fingerprints, and :func:`read_shard` checks them before anything is written).
    """
    rules = dataclasses.replace(DocumentRules.for_format(options, shard.format), keep_fields=(), title_field=None)
    root = resolve_root(options)
    for position, (_, row, line, item, integer) in enumerate(_items(options, root, shard, rules)):
        if isinstance(item, Document):
            yield position, item.id, item.text, row, line, integer


def ids_can_repeat(options: CorpusOptions, shard: Shard) -> bool:
    """Whether ``shard``'s ids come from an id field (and so may repeat another shard's): not for a
    text file, whose id is its path, nor for a row whose id is its place (no ``id_field``)."""
    return shard.bad_file is None and shard.format != "text" \
        and DocumentRules.for_format(options, shard.format).id_field is not None


def shard_id(options: CorpusOptions, sources: Sequence[SourceFile], start: int, stop: int, fmt: str,
             *, unreadable: bool = False) -> str:
    """The id of a shard: 16 hex chars of blake2b over everything that decides its content.

    ``unreadable`` marks the shard of a bad file, so it never shares an id with a readable range.
    """
    payload: dict[str, object] = {
        "version": SHARD_ID_VERSION,
        "sources": [[source.path, source.fingerprint] for source in sources],
        "start": start,
        "stop": stop,
        "format": fmt,
        "id_field": options.id_field,
        "text_field": options.text_field,
        "keep_fields": list(options.keep_fields),
    }
    if unreadable:
        payload["unreadable"] = True
    encoded = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(encoded, digest_size=SHARD_ID_HEX // 2).hexdigest()


def _shard(options: CorpusOptions, sources: Sequence[SourceFile], start: int, fmt: str,
           stop: int | None = None, bad_file: BadFile | None = None, *, mark: RowMark | None = None) -> Shard:
    if stop is None:  # a group of text files: positions in the sorted list of text files
        stop = start + len(sources)
    paths = tuple(source.path for source in sources)
    identity = shard_id(options, sources, start, stop, fmt, unreadable=bad_file is not None)
    return Shard(identity, paths, start, stop, fmt, bad_file, mark)


def _items(options: CorpusOptions, root: CorpusRoot, shard: Shard, rules: DocumentRules,
           ) -> Iterator[tuple[str, int | None, int | None, Document | Reject, bool]]:
    """Each row's place (file, row, line: ``rows.Place``'s parts), what it became, and whether its id
    field held an integer.

    A shard may hold millions of rows: the common one (:meth:`DocumentRules.plain`) costs no ``Place``
    and no call of the full rules.
    """
    if shard.format == "text":
        for path in shard.sources:
            row = read_text(root.fs, root.url(path), _format(options, shard, path), path, rules.text_field,
                            options.on_bad_file)
            yield path, None, None, rules.to_item(row, Place(path)), False
        return
    if len(shard.sources) != 1:
        raise CorpusError(f"shard {shard.id}: a {shard.format} shard reads exactly one source")
    path = shard.sources[0]
    fmt = _format(options, shard, path)
    plain = rules.plain if rules.quick else None
    for number, line, row in iter_rows(root.fs, root.url(path), fmt, path, shard.start, shard.stop,
                                       columns=rules.columns(), on_bad_file=options.on_bad_file, mark=shard.mark):
        found = plain(row) if plain is not None else None
        if found is not None:
            yield path, number, line, Document(found[0], found[1]), found[2]
        else:
            yield path, number, line, rules.to_item(row, Place(path, number, line)), rules.integer_id(row)


def _format(options: CorpusOptions, shard: Shard, path: str) -> FileFormat:
    """The file's compression and delimiter from its name; the format itself as planned."""
    return dataclasses.replace(detect_format(path, options.format), name=shard.format)


def _verify(options: CorpusOptions, root: CorpusRoot, shard: Shard) -> None:
    if root.kind == "builtin":
        _, sources = list_sources(options)
    else:
        assert root.fs is not None
        sources = []
        for path in shard.sources:
            try:
                info = root.fs.info(root.url(path))
            except FileNotFoundError as exc:
                raise CorpusError(f"{path}: the file is gone since planning; plan again") from exc
            except OSError as exc:
                raise CorpusError(f"{path}: storage refused: {exc}") from exc
            sources.append(SourceFile(path, root.url(path), fingerprint(info)))
    expected = shard_id(options, sources, shard.start, shard.stop, shard.format,
                        unreadable=shard.bad_file is not None)
    if expected != shard.id:
        raise CorpusError(f"{', '.join(shard.sources)}: changed since shard {shard.id} was planned; "
                          "plan again")
