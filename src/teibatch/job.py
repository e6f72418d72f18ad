"""The job spec: every section of a job file, its defaults, and validation with clear errors.

Pydantic is used here and only here, at the job-file boundary; the rest of teibatch
receives plain frozen records built from a validated :class:`JobSpec`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from teibatch.corpus.builtin import is_builtin
from teibatch.corpus.overlap import output_inside
from teibatch.corpus.records import DEFAULT_SHARD_DOCS, DEFAULT_TEXT_FIELD, CorpusOptions
from teibatch.errors import JobSpecError
from teibatch.jobfile import KeyPath, RawJob, every_problem, load_job_file, override_error, override_key
from teibatch.sink.parts import CHUNK_COLUMNS, CHUNK_TEXT_COLUMN

DEFAULT_PAYLOAD_LIMIT = 2_000_000
DEFAULT_LOCAL_SERVERS = 2
DEFAULT_MAX_RETRIES = 6
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_ROW_GROUP_SIZE = 8192

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``90``, ``"90s"``, ``"30m"``, ``"2h"`` or ``"1h30m"``."""
    if isinstance(text, int | float):
        return float(text)
    if text.strip().replace(".", "", 1).isdigit():
        return float(text)
    match = _DURATION.match(text)
    if match is None or not any(match.groups()):  # blank text matches, with no group
        raise ValueError(f"{text!r} is not a duration (write 90s, 30m, 2h or 1h30m)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorpusSection(_Section):
    path: str = Field(min_length=1)
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "text"] = "auto"
    id_field: str | None = None
    text_field: str = DEFAULT_TEXT_FIELD
    keep_fields: tuple[str, ...] = ()
    keep_fields_types: Literal["strict", "stringify"] = "strict"  # kept values keep their JSON types, or become text
    shard_docs: int = Field(DEFAULT_SHARD_DOCS, ge=1, le=10_000_000)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    on_bad_file: Literal["fail", "reject"] = "fail"   # a file that breaks off: fail its shard, or reject the rest
    deduplicate: bool = True  # identical texts sent once (pipeline/dedup.py); the output is the same either way
    exclude: tuple[str, ...] = ()  # glob patterns of files (or folders) under the corpus root never read


class ModelSection(_Section):
    id: str | None = None
    normalize: bool = True
    truncate: bool = True
    truncation_direction: Literal["right", "left"] = "right"
    prompt_name: str | None = None
    dimensions: int | None = Field(None, ge=1)
    on_too_long: Literal["reject", "truncate"] = "reject"
    kind: Literal["auto", "dense", "sparse"] = "auto"  # auto: sparse when the servers serve a SPLADE model


class SshHostSection(_Section):
    """One host of provider ssh (in ``servers.hosts`` or in the ``servers.inventory`` file)."""

    address: str = Field(min_length=1)
    port: int = Field(22, ge=1, le=65535)
    user: str | None = None
    key_file: str | None = None
    jump_host: str | None = None
    destroy_command: str | None = None
    gpu_index: int | None = Field(None, ge=0)
    known_hosts: str | None = None
    host_key_checking: Literal["yes", "accept-new"] = "yes"


class StaticServerSection(_Section):
    """A static server with settings of its own (``servers.urls`` also takes plain URLs)."""

    url: str
    payload_limit: int | None = Field(None, ge=1024)

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/")


CLOUD_PROVIDERS = ("lambda", "runpod", "vast")
SPOT_PROVIDERS = ("vast",)   # clouds whose spot (interruptible) capacity teibatch rents (RunPod's API v2 rents none)
CLOUD_NAMES = {"lambda": "Lambda Cloud", "runpod": "RunPod (API v2)", "vast": "Vast.ai"}


class ServersSection(_Section):
    provider: Literal["local", "static", "ssh", "lambda", "runpod", "vast"] = "local"
    count: int = Field(DEFAULT_LOCAL_SERVERS, ge=1, le=64)
    urls: tuple[StaticServerSection, ...] = ()
    api_key_env: str | None = None
    server_args: tuple[str, ...] = ()
    startup_timeout: float = Field(60.0, gt=0)
    engine: Literal["auto", "builtin", "docker"] = "auto"
    hosts: tuple[SshHostSection, ...] = ()
    inventory: str | None = None
    image: str | None = None
    volume: str | None = None
    remove_volume: bool = False
    # GPU clouds (lambda, runpod, vast): which cards to rent
    gpu: tuple[str, ...] = ()                       # GPU names, any of them ("A10", "RTX 4090")
    min_vram_gb: int | None = Field(None, ge=1)
    max_price: float | None = Field(None, gt=0)     # USD per card-hour (spot: the highest bid)
    capacity: Literal["on-demand", "spot", "any"] = "on-demand"   # any: spot first, else on-demand
    min_reliability: float | None = Field(None, ge=0, le=1)       # vast: the machines' reliability score
    regions: tuple[str, ...] = ()                   # lambda regions / runpod data centers, in order of preference
    # instances never healthy, or taken back mid-run, replaced at most this often in all; None: servers.count
    max_replacements: int | None = Field(None, ge=0, le=64)
    ssh_key_name: str | None = None                 # lambda: the SSH key registered with Lambda Cloud
    key_file: str | None = None                     # lambda, vast: the private key file (OpenSSH reads it)
    ssh_user: str = "ubuntu"                        # lambda (vast: root)
    ssh_port: int = Field(22, ge=1, le=65535)       # lambda
    network_volume_id: str | None = None            # runpod: keep the model weights in this network volume
    cloud_type: Literal["SECURE", "COMMUNITY"] = "SECURE"   # runpod: the pods' cloud (RunPod's API v2 has no "ALL")
    container_disk_gb: int = Field(40, ge=1)        # runpod, vast

    def host_sections(self) -> list[SshHostSection]:
        """The hosts of ``hosts`` and of the ``inventory`` file, each checked by the rules of ``hosts``
        (an inventory host that breaks one: :class:`JobSpecError` naming the file, the host and the key)."""
        from teibatch.fleet.providers.ssh import read_inventory

        sections = list(self.hosts)
        folder = os.path.dirname(self.inventory or "")
        for index, host in enumerate(read_inventory(self.inventory) if self.inventory else []):
            # Its relative paths are the inventory file's folder's, as a job file's are its own folder's.
            host = {key: os.path.normpath(os.path.join(folder, value)) if key in HOST_PATH_KEYS
                    and isinstance(value, str) and _local_relative(value) else value for key, value in host.items()}
            try:
                sections.append(SshHostSection.model_validate(host))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in (index, *first["loc"]))
                raise JobSpecError(f"{self.inventory}: hosts.{where}: {first['msg']}",
                                   key="servers.inventory") from None
        return sections

    @field_validator("gpu", mode="before")
    @classmethod
    def _one_gpu(cls, value: Any) -> Any:
        """``gpu: A10`` is ``gpu: [A10]``."""
        return [value] if isinstance(value, str) else value

    @field_validator("urls", mode="before")
    @classmethod
    def _plain_urls(cls, urls: Any) -> Any:
        """A plain URL is a server with default settings."""
        if isinstance(urls, list | tuple):
            return [{"url": u} if isinstance(u, str) else u for u in urls]
        return urls

    @model_validator(mode="after")
    def _provider_needs(self) -> ServersSection:
        if self.provider == "static" and not self.urls:
            raise ValueError("provider static needs servers.urls: a list of TEI base URLs")
        if self.provider == "local" and self.urls:
            raise ValueError("servers.urls is for provider static; provider local starts its own servers")
        if self.provider == "ssh" and not self.hosts and not self.inventory:
            raise ValueError("provider ssh needs servers.hosts (a list of hosts) or servers.inventory "
                             "(a YAML file of hosts)")
        if self.provider != "ssh" and (self.hosts or self.inventory):
            raise ValueError("servers.hosts and servers.inventory are for provider ssh")
        if self.provider == "lambda" and not self.ssh_key_name:
            raise ValueError("provider lambda needs servers.ssh_key_name: the name of an SSH key added to your "
                             "Lambda Cloud account (and servers.key_file: its private key, unless OpenSSH finds it)")
        cloud_only = [k for k in ("gpu", "min_vram_gb", "max_price", "regions", "ssh_key_name", "network_volume_id")
                      if getattr(self, k)]
        if self.capacity != "on-demand":
            cloud_only.append("capacity")
        if self.provider not in CLOUD_PROVIDERS and cloud_only:
            raise ValueError(f"servers.{cloud_only[0]} is for the GPU clouds (provider lambda, runpod or vast)")
        if self.provider in CLOUD_PROVIDERS and self.provider not in SPOT_PROVIDERS and self.capacity != "on-demand":
            raise ValueError(f"servers.capacity: {self.capacity}: {CLOUD_NAMES[self.provider]} offers no spot "
                             f"(interruptible) capacity; use capacity: on-demand, or provider "
                             f"{' or '.join(SPOT_PROVIDERS)}")
        if self.min_reliability is not None and self.provider != "vast":
            raise ValueError("servers.min_reliability is for provider vast (the marketplace's machine reliability)")
        if self.provider == "vast":
            for key in ("regions", "network_volume_id"):
                if getattr(self, key):
                    raise ValueError(f"servers.{key} is not supported by provider vast (its offers are single "
                                     "machines: choose them by gpu, min_vram_gb, max_price and min_reliability)")
            for key in ("ssh_key_name", "ssh_port"):
                if key in self.model_fields_set:
                    raise ValueError(f"servers.{key} is not used by provider vast: the public key of servers.key_file "
                                     "(<key_file>.pub) is attached to each instance, and Vast chooses the port")
        return self


class ExportSection(_Section):
    """Where server volumes go before their hosts are destroyed, and where a new host's come from."""

    to: str | None = None
    waive: bool = False
    import_from: str | None = None
    timeout: float = 3600.0
    storage_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        seconds = parse_duration(value)
        if seconds <= 0:
            raise ValueError("must be a positive duration (90s, 30m, 2h)")
        return seconds


class ClientSection(_Section):
    route: Literal["auto", "embed", "openai-base64"] = "auto"
    max_batch_size: int | Literal["auto"] = "auto"
    max_inflight_inputs: int | Literal["auto"] = "auto"
    max_input_length: int | Literal["auto"] = "auto"
    payload_limit: int = Field(DEFAULT_PAYLOAD_LIMIT, ge=1024)
    max_retries: int = Field(DEFAULT_MAX_RETRIES, ge=0, le=100)
    request_timeout: float = Field(DEFAULT_REQUEST_TIMEOUT_S, gt=0)

    @field_validator("max_batch_size", "max_inflight_inputs", "max_input_length")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be auto or a positive integer")
        return value


class OutputSection(_Section):
    path: str = Field(min_length=1)
    vector_type: Literal["float32", "float16", "int8", "uint8", "binary"] = "float32"
    keep_float: bool = False                       # also write the float32 vector (`embedding_float`)
    compression: Literal["zstd", "snappy", "gzip", "lz4", "none"] = "zstd"
    row_group_size: int = Field(DEFAULT_ROW_GROUP_SIZE, ge=1)
    storage_options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _float_kept_beside(self) -> OutputSection:
        if self.keep_float and self.vector_type == "float32":
            raise ValueError("keep_float writes the float32 vector beside a vector_type of float16, int8, uint8 "
                             "or binary; with vector_type float32 the embedding column is that vector already")
        return self

    def output_options(self) -> dict[str, Any]:
        """The options an output keeps; ``output.keep_float`` only when on (see :meth:`JobSpec.output_options`)."""
        return {"output.vector_type": self.vector_type, **({"output.keep_float": True} if self.keep_float else {})}


CHUNKING_OFF_KEYS = ("max_tokens", "overlap_tokens", "title_field", "prefix", "store_text", "document_vector",
                     "tokenizer")


class ChunkingSection(_Section):
    """Long documents cut into chunks, each embedded as its own row (``pipeline/chunks.py``).

    Off unless ``strategy`` is set: an output written without chunking keeps its meaning, and
    ``output_options`` gains ``chunking.*`` keys only when it is on.
    """

    strategy: Literal["tokens", "sentences", "paragraphs", "chars"] | None = None
    max_tokens: int | Literal["auto"] = "auto"    # auto: the servers' max_input_length (or client.max_input_length)
    overlap_tokens: int = Field(0, ge=0)
    title_field: str | None = None                 # a corpus field prepended to every chunk, then a line break
    prefix: str = ""                               # a fixed text before every chunk (and its title)
    store_text: bool = False                       # write each chunk's text in a `text` column
    document_vector: Literal["none", "mean"] = "none"
    tokenizer: str = "auto"                        # auto, builtin-hashing, or a tokenizer.json (or its folder)

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 2:
            raise ValueError("must be auto or an integer of at least 2")
        return value

    @field_validator("title_field", "tokenizer")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChunkingSection:
        if self.strategy is None:
            changed = [key for key in CHUNKING_OFF_KEYS if getattr(self, key) != type(self).model_fields[key].default]
            if changed:
                raise ValueError(f"chunking.{changed[0]} is set but chunking is off: set chunking.strategy "
                                 f"(tokens, sentences, paragraphs or chars), or remove chunking.{changed[0]}")
        if isinstance(self.max_tokens, int) and self.overlap_tokens >= self.max_tokens:
            raise ValueError(f"chunking.overlap_tokens ({self.overlap_tokens}) must be below chunking.max_tokens "
                             f"({self.max_tokens})")
        if self.strategy == "chars" and self.tokenizer != "auto":
            raise ValueError("chunking.strategy chars counts characters: remove chunking.tokenizer")
        return self

    @property
    def enabled(self) -> bool:
        return self.strategy is not None

    def output_options(self) -> dict[str, Any]:
        """The options that shape an output's rows, by job-file key (the tokenizer is not one: the same
        model's tokenizer found at another path cuts the same chunks, and each chunk's hash covers its text)."""
        return {f"chunking.{key}": getattr(self, key) for key in
                ("strategy", "max_tokens", "overlap_tokens", "title_field", "prefix", "store_text", "document_vector")}


class LimitsSection(_Section):
    max_runtime: float | None = None
    max_shards_in_flight: int | Literal["auto"] = "auto"
    max_cost: float | None = Field(None, gt=0)   # USD: a run whose planned cost (what it rents) is higher is refused

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)


class JobSpec(_Section):
    """A validated job file."""

    name: str = "teibatch-job"
    corpus: CorpusSection
    model: ModelSection = ModelSection()
    servers: ServersSection = ServersSection()
    client: ClientSection = ClientSection()
    output: OutputSection
    mode: Literal["full", "incremental"] = "full"
    limits: LimitsSection = LimitsSection()
    export: ExportSection = ExportSection()
    chunking: ChunkingSection = ChunkingSection()

    @model_validator(mode="after")
    def _sparse_fits(self) -> JobSpec:
        if self.model.kind == "sparse" and (conflicts := self.sparse_conflicts()):
            raise ValueError(conflicts[0])
        return self

    def sparse_conflicts(self) -> list[str]:
        """What in this job cannot apply to sparse vectors (``model.kind: sparse``, or ``auto`` meeting a
        SPLADE model), one sentence each naming the key; empty when nothing."""
        conflicts = []
        if self.model.dimensions is not None:
            conflicts.append("model.dimensions cuts dense vectors; sparse ones (model.kind: sparse) have no "
                             "such option: remove model.dimensions")
        if self.output.vector_type != "float32":
            conflicts.append(f"output.vector_type {self.output.vector_type} is for dense vectors; sparse ones "
                             "(model.kind: sparse) are written as float32 values: remove output.vector_type")
        if self.client.route != "auto":
            conflicts.append(f"client.route {self.client.route} is a dense route; sparse vectors (model.kind: "
                             "sparse) come from /embed_sparse: set client.route: auto")
        if self.chunking.document_vector != "none":
            conflicts.append("chunking.document_vector: mean averages dense vectors; with sparse ones "
                             "(model.kind: sparse) set it to none")
        return conflicts

    @model_validator(mode="after")
    def _chunk_columns_free(self) -> JobSpec:
        if self.chunking.enabled:
            taken = [name for name, _ in CHUNK_COLUMNS] + ([CHUNK_TEXT_COLUMN] if self.chunking.store_text else [])
            clash = [name for name in self.corpus.keep_fields if name in taken]
            if clash:
                raise ValueError(f"corpus.keep_fields names {clash[0]!r}, a column chunking writes itself "
                                 f"({', '.join(taken)}): leave it out of keep_fields")
        return self

    def corpus_options(self) -> CorpusOptions:
        """The corpus section as the record ``teibatch.corpus`` reads, leaving out the job's output
        when it lies inside the corpus; :class:`JobSpecError` when the output is the corpus folder
        or holds the corpus (``corpus/overlap.py``)."""
        c = self.corpus
        options = CorpusOptions(path=c.path, format=c.format, id_field=c.id_field, text_field=c.text_field,
                                keep_fields=c.keep_fields, shard_docs=c.shard_docs,
                                storage_options=dict(c.storage_options), on_bad_file=c.on_bad_file,
                                keep_fields_types=c.keep_fields_types, title_field=self.chunking.title_field,
                                exclude_globs=c.exclude)
        inside = output_inside(options, self.output.path, self.output.storage_options)
        return dataclasses.replace(options, exclude=(inside,)) if inside else options

    def vector_options(self) -> dict[str, Any]:
        """Everything that changes the vector of a text (part of every content hash)."""
        m = self.model
        return {"model": m.id, "normalize": m.normalize, "truncate": m.truncate,
                "truncation_direction": m.truncation_direction, "prompt_name": m.prompt_name,
                "dimensions": m.dimensions, "on_too_long": m.on_too_long}

    def output_options(self) -> dict[str, Any]:
        """What makes two outputs comparable, by job-file key: the vector options, the reading options,
        the vector type, and only when on ``output.keep_float`` and the chunking options (so outputs
        written without them keep their fingerprint).

        The manifest keeps them beside their digest (:meth:`output_fingerprint`), so that a job whose
        options differ from an output's is refused naming each option that changed.
        """
        c = self.corpus
        return {**{f"model.{'id' if key == 'model' else key}": value for key, value in self.vector_options().items()},
                "corpus.id_field": c.id_field, "corpus.text_field": c.text_field,
                "corpus.keep_fields": list(c.keep_fields), **self.output.output_options(),
                **(self.chunking.output_options() if self.chunking.enabled else {})}

    def output_fingerprint(self) -> str:
        """A digest of :meth:`output_options`, in the shape earlier teibatch versions digested (their
        outputs keep matching): ``{"vector": {"model": …, "normalize": …}, "reading": {"id_field": …}}``."""
        options = self.output_options()
        vector = {("model" if key == "model.id" else key.removeprefix("model.")): value
                  for key, value in options.items() if key.startswith("model.")}
        reading = {key.partition(".")[2]: value for key, value in options.items()
                   if not key.startswith(("model.", "chunking."))}
        chunking = {key.partition(".")[2]: value for key, value in options.items() if key.startswith("chunking.")}
        blob = orjson.dumps({"vector": vector, "reading": reading, **({"chunking": chunking} if chunking else {})},
                            option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(blob, digest_size=8).hexdigest()


PATH_KEYS: tuple[KeyPath, ...] = (("corpus", "path"), ("output", "path"), ("export", "to"), ("export", "import_from"),
                                  ("servers", "inventory"), ("servers", "key_file"), ("chunking", "tokenizer"))
"""The keys that name files or folders on this machine (or URLs); ``servers.hosts[*]`` adds :data:`HOST_PATH_KEYS`."""
HOST_PATH_KEYS = ("key_file", "known_hosts")
_NAMES_NOT_PATHS = frozenset({"auto", "builtin-hashing"})  # chunking.tokenizer's rules


def load_job(path: str | Path, overrides: list[str] | None = None,
             environ: dict[str, str] | None = None) -> JobSpec:
    """Load and validate a job file; raise :class:`JobSpecError` naming the file, the key and the line.

    Relative paths written in the file are taken from the file's folder (see :func:`resolve_paths`).
    """
    raw = load_job_file(path, overrides, environ)
    resolve_paths(raw)
    _chunking_turned_off(raw)
    return validate_job(raw)


def _chunking_turned_off(raw: RawJob) -> None:
    """``--set chunking.strategy=null`` turns chunking off: the file's other chunking keys are set aside
    (a section of a chunked job has several; ``--set`` cannot remove them one by one). Chunking keys
    given with ``--set`` too stay, and are refused as with chunking off."""
    section = raw.data.get("chunking")
    key = ("chunking", "strategy")
    if key not in raw.overrides or not isinstance(section, dict) or section.get("strategy") is not None:
        return
    given = {path[1] for path in raw.overrides if len(path) > 1 and path[0] == "chunking"}
    raw.data["chunking"] = {name: value for name, value in section.items() if name in given}


def resolve_paths(raw: RawJob) -> None:
    """Make each relative local path the job file gives (:data:`PATH_KEYS`) relative to the file's folder.

    A job then means the same files from whatever folder it is run (cron runs from the home folder).
    URLs (``s3://``), ``builtin:`` corpora, absolute paths and ``~`` paths stay as written; a value given
    with ``--set`` stays relative to the current folder, as a shell user expects of a command-line value.
    The joined path stays relative when the file was named by a relative path, so messages stay short.
    """
    folder = os.path.dirname(raw.file)
    if not folder:
        return
    servers = raw.data.get("servers")
    hosts = servers.get("hosts") if isinstance(servers, dict) else None
    host_keys = [("servers", "hosts", str(index), key) for index in range(len(hosts)) for key in HOST_PATH_KEYS] \
        if isinstance(hosts, list) else []
    for key in (*PATH_KEYS, *host_keys):
        holder = _holder(raw.data, key)
        value = holder.get(key[-1]) if holder is not None else None
        if holder is not None and isinstance(value, str) and raw.override_of(key) is None and _local_relative(value):
            holder[key[-1]] = os.path.normpath(os.path.join(folder, value))


def _holder(data: dict[str, Any], key: KeyPath) -> dict[str, Any] | None:
    """The mapping that holds ``key``'s value, or ``None`` when the file has no such place."""
    node: Any = data
    for part in key[:-1]:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict) else None


def _local_relative(value: str) -> bool:
    """Whether ``value`` is a relative path on this machine (not a URL, a built-in corpus, ``~`` or a rule name)."""
    return not ("://" in value or is_builtin(value) or value.startswith("~") or os.path.isabs(value)
                or value in _NAMES_NOT_PATHS or not value)


def validate_job(raw: RawJob) -> JobSpec:
    """Validate loaded job data; every problem goes into one :class:`JobSpecError`.

    A problem in a value given by ``--set`` names that option as typed (``--set corpus.shard_doc=5:
    unknown key ...``), not a line of the file it did not come from; a problem in the file names
    its line. Several problems are listed one a line (``jobfile.every_problem``); a value that
    fits none of a key's types (``max_batch_size: abc``) is one problem, not one per type.
    """
    try:
        return JobSpec.model_validate(raw.data)
    except ValidationError as exc:
        errors = exc.errors()
    by_key: dict[tuple[str, ...], list[Any]] = {}
    for error in errors:
        by_key.setdefault(_key_path(error["loc"])[0], []).append(error)
    raise every_problem([_problem(raw, key_path, found) for key_path, found in by_key.items()]) from None


def _problem(raw: RawJob, key_path: tuple[str, ...], errors: list[Any]) -> JobSpecError:
    """The error of one key: at its ``--set`` when one gave it, else at its line of the file."""
    key = ".".join(key_path) or None
    explained = [_explain(error) for error in errors]
    text = explained[0] + "".join(f"; or {other.removeprefix('Input should be ')}" for other in explained[1:])
    override = raw.override_of(key_path)
    if override is not None:
        # A problem inside the value (an item of a list, a key of a mapping) says which one, unless
        # its message does already (an unknown key).
        inside = len(key_path) > len(override_key(override)) and errors[0]["type"] != "extra_forbidden"
        return override_error(override, f"{key}: {text}" if inside else text, key)
    changed = raw.overrides_under(key_path)
    suffix = f" (with {', '.join('--set ' + setting for setting in changed)})" if changed else ""
    return JobSpecError(text + suffix, file=raw.file, key=key, line=raw.line_of(key_path))


def _key_path(loc: tuple[Any, ...]) -> tuple[tuple[str, ...], type[BaseModel] | None]:
    """The job-file keys of a validation error's location, without the names pydantic gives the
    members of a union type (``client.max_batch_size.int`` is ``client.max_batch_size``); and the
    section model they end at (``None``: a plain value, or a key the job file does not take)."""
    model: type[BaseModel] | None = JobSpec
    path: list[str] = []
    for part in loc:
        if isinstance(part, int):
            path.append(str(part))  # an item of a list of sections
        elif model is not None:
            info = model.model_fields.get(str(part))
            path.append(str(part))
            model = _section_model(info.annotation) if info is not None else None
        # else: a union member's name inside a plain value: not a key
    return tuple(path), model


def _explain(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        loc = tuple(error["loc"])
        where = ".".join(str(part) for part in loc[:-1] if not isinstance(part, int))
        known = ", ".join(_known_keys(loc[:-1]))
        return (f"unknown key {str(loc[-1])!r}{f' in {where}' if where else ''}"
                f"{f' (known: {known})' if known else ''}")
    if kind == "missing":
        return "this key is required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _known_keys(section: tuple[Any, ...]) -> tuple[str, ...]:
    """The keys the job file takes at ``section`` (a validation error's location), or ``()``."""
    model = _key_path(section)[1]
    return tuple(model.model_fields) if model is not None else ()


def _section_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _section_model(arg)
        if found is not None:
            return found
    return None
