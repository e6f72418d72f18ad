"""Every error teibatch raises on purpose.

The hierarchy::

    TeibatchError
    ├── JobSpecError            the job file or command line is wrong (exit code 2)
    │   └── TokenizerUnavailable chunking.tokenizer's file missing or unreadable (exit 2)
    ├── CorpusError             the corpus cannot be listed or read as a whole
    │   ├── CorpusMismatch      the corpus does not fit the job: no file, missing fields, unparsable (exit 2)
    │   └── CorpusAccessDenied  the corpus's storage refuses the credentials: none, invalid, not allowed (exit 2)
    ├── TeiError                a TEI server answered with an error, or did not answer
    │   ├── TeiOverloaded       429: inputs in flight over max_concurrent_requests
    │   ├── PayloadTooLarge     413: request body over the server's payload limit
    │   ├── TooManyInputs       422 (413 before 1.9): more inputs than max_client_batch_size
    │   ├── InputTooLong        422: an input longer than max_input_length with truncate=false
    │   ├── TeiUnavailable      503, 5xx, refused/reset connections, timeouts
    │   │   └── ServerFault     200 with a wrong answer: count, dimension, NaN/Inf, not normalized, not JSON
    │   ├── TeiAuthError        401: missing or wrong API key (exit code 3)
    │   ├── WrongModelKind      424: not an embedding model, or not the kind asked (exit code 3)
    │   └── TeiRequestError     any other 4xx: the request itself is wrong
    ├── SinkError               the output cannot be written or its manifest is unreadable
    │   ├── OutputUnwritable    the output path cannot be written, found before any work (exit code 2)
    │   ├── OutputMismatch      the output holds vectors made with other options (exit code 3)
    │   ├── DimensionMismatch   the servers give vectors of another dimension than the output's (exit 2)
    │   ├── OutputLocked        another run is writing this output; this one did nothing (exit code 4)
    │   ├── LockLost            another run took the output's lock over mid-run (exit code 4)
    │   ├── RepeatedIds         the output's vectors hold an id more than once (exit code 3)
    │   └── StorageFull         the output's storage (or TMPDIR) is full: make room, then resume (exit 1)
    ├── RunIncomplete           some shards were not committed (exit code 1, resumable)
    ├── RejectsFound            --fail-on-rejects and some documents were rejected (exit code 1)
    ├── RayUnavailable          Ray could not be started or joined (exit code 1)
    ├── SenderFailed            a shard's sender kept dying mid-chunk: the shard is left for the next run (exit 1)
    └── FleetError              servers could not be launched, reached or destroyed
        ├── CapacityUnavailable no server could be started or none stayed healthy
        ├── TeardownIncomplete  something launched could not be destroyed
        │   └── ExportFailed    a volume was not copied off and verified: hosts kept
        ├── GpuUnsupported      a host's GPU is refused (compute capability, image, memory)
        ├── FleetTimeout        a fleet wait passed its deadline
        ├── CloudApiError       a GPU cloud's API answered with an error (status_code; 5xx: retryable)
        │   └── RateLimited     it kept answering 429 after the waits it asked for (retry_after)
        └── SshError            an SSH connection or a remote command failed
            ├── HostUnreachable cannot connect or log in
            ├── HostKeyRejected the host key is unknown or changed
            └── RemoteCommandFailed a command on the host exited with an error

Code that retries or tears down branches on the type and on the fields
(``status_code``, ``server``, ``retryable``, ``retry_after``), never on message text.
No message and no ``repr`` contains a secret: servers are named by URL only.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_LOCKED = 4


class TeibatchError(Exception):
    """Root of every error teibatch raises on purpose; ``exit_code`` is what the CLI exits with."""

    exit_code: int = EXIT_INCOMPLETE

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (Ray tasks): rebuild them without calling __init__.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[TeibatchError], args: tuple[object, ...], state: dict[str, object]) -> TeibatchError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class JobSpecError(TeibatchError):
    """The job file or a command-line value is wrong; nothing was launched.

    Fix the key named in the message (``file``, ``key`` and ``line`` say where) and run again.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None) -> None:
        self.file = file
        self.key = key
        self.line = line
        where = ""
        if file:
            where = file + (f":{line}" if line else "")
        if key:
            where = f"{where}: {key}" if where else key
        super().__init__(f"{where}: {message}" if where else message)


class TokenizerUnavailable(JobSpecError):
    """The ``tokenizer.json`` that ``chunking.tokenizer`` names, needed to count tokens as the servers
    do, is not there or cannot be read, or the ``tokenizers`` package is not installed (the message
    gives the install command). With ``tokenizer: auto`` a run does not stop for it (the servers'
    ``/tokenize`` counts); only a look-up before any server is met raises it (``tried`` lists the
    paths, in order).

    Give the path of the model's tokenizer.json, or download the model into a Hugging Face cache
    (``huggingface-cli download ORG/NAME tokenizer.json``) or the servers' volume folder.
    """

    def __init__(self, message: str, *, tried: tuple[str, ...] = (), file: str | None = None,
                 key: str | None = None, line: int | None = None) -> None:
        self.tried = tried
        super().__init__(message, file=file, key=key, line=line)


class CorpusError(TeibatchError):
    """The corpus as a whole cannot be read: no file matches, a format is unknown, storage refuses.

    Single bad documents are never raised; they are rejected with a reason instead.
    """


class CorpusAccessDenied(CorpusError):
    """The storage holding the corpus refuses this machine's credentials: none found, invalid or expired,
    or not allowed to list or read the path. Found before any work, like an output that cannot be
    written (:class:`OutputUnwritable`): a configuration error, not a run to resume. Fix the credentials
    (the environment, the store's usual file) or ``corpus.storage_options`` and run again.
    """

    exit_code = EXIT_USAGE


class CorpusMismatch(CorpusError):
    """The corpus does not fit the job: nothing matches the path, a field the job names is not in the
    records (the message lists the fields seen), a file cannot be parsed at all, or a kept field's
    value does not fit the type the output gives that field (``corpus.keep_fields_types``).

    ``file``, ``line`` and ``field`` say where when known. Fix the job's ``corpus`` section or the file.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.file = file
        self.line = line
        self.field = field
        where = (file + (f":{line}" if line else "")) if file else ""
        super().__init__(f"{where}: {message}" if where else message)


class TeiError(TeibatchError):
    """A TEI server answered with an error or did not answer at all.

    ``server`` is the server's URL, ``status_code`` the HTTP status (``None`` when no answer came),
    ``retryable`` whether sending the same request again may succeed.
    """

    retryable: bool = False

    def __init__(self, message: str, *, server: str, status_code: int | None = None,
                 retry_after: float | None = None) -> None:
        self.server = server
        self.status_code = status_code
        self.retry_after = retry_after
        super().__init__(f"{server}: {message}")


class TeiOverloaded(TeiError):
    """429 ``Model is overloaded``: too many inputs in flight; nothing was processed, resend later."""

    retryable = True


class PayloadTooLarge(TeiError):
    """413: the request body is over the server's ``--payload-limit``; split it and resend."""


class TooManyInputs(TeiError):
    """422 (413 before TEI 1.9): more inputs than ``max_client_batch_size``; split and resend."""


class InputTooLong(TeiError):
    """422: an input is longer than ``max_input_length`` tokens and truncation was off.

    Reject the document, or set ``model.truncate: true`` in the job file.
    """


class TeiUnavailable(TeiError):
    """503, another 5xx, a refused or reset connection, or a timeout: try another server."""

    retryable = True


class ServerFault(TeiUnavailable):
    """The server answered 200 but the answer is wrong: another number of vectors than inputs, another
    dimension, NaN or infinite values, vectors not normalized though ``normalize`` is on, or a body
    that is not the route's JSON (a proxy's HTML page). ``kind`` names the fault in a word or two.

    The documents are not at fault: they are sent to another server, and a server that keeps
    answering wrongly is taken out of the pool like a dead one.
    """

    def __init__(self, message: str, *, server: str, kind: str, status_code: int | None = 200) -> None:
        self.kind = kind
        super().__init__(message, server=server, status_code=status_code)


class TeiAuthError(TeiError):
    """401: the server wants an API key and the one sent (if any) is wrong.

    Put the key in the environment variable named by ``servers.api_key_env``.
    """

    exit_code = EXIT_REFUSED


class WrongModelKind(TeiError):
    """424 ``Model is not an embedding model``: the server serves a reranker or classifier; or a SPLADE
    model asked for dense vectors (``model.kind: dense``), or another model asked for sparse ones
    (``model.kind: sparse``).

    Point the job at a server launched with an embedding model, or set ``model.kind`` to what it
    serves (``auto`` takes either).
    """

    exit_code = EXIT_REFUSED


class TeiRequestError(TeiError):
    """Any other 4xx answer: the request is wrong for this server (bad option, bad prompt name)."""


class SinkError(TeibatchError):
    """The output cannot be written, or an existing output belongs to a different job."""


class OutputUnwritable(SinkError):
    """A probe file could not be written to ``output.path`` (permissions, a missing bucket, credentials).

    Found before any server starts; fix ``output.path`` or its access and run again.
    """

    exit_code = EXIT_USAGE


class OutputMismatch(SinkError):
    """The output already holds vectors made with other model options or reading options.

    The message names each option that differs, the stored value and this job's
    (``model.normalize: stored true, this job false``). Run with the stored values, write to a new
    ``output.path``, or delete the old output first.
    """

    exit_code = EXIT_REFUSED


class DimensionMismatch(SinkError):
    """The servers give vectors of another dimension (or another model) than the output already holds.

    Point the job at servers with the output's model, or write to a new ``output.path``.
    """

    exit_code = EXIT_USAGE


class OutputLocked(SinkError):
    """Another run is writing this output (its ``_lock.json`` names it); this run did nothing.

    Wait for that run to end. A lock left by a run that died is taken over once its process is gone
    (same host) or its heartbeat is older than two minutes.
    """

    exit_code = EXIT_LOCKED


class LockLost(SinkError):
    """Another run took this output's lock over while this run was still going; this run stopped.

    Its committed shards stay committed; the run that now holds the lock finishes the rest.
    """

    exit_code = EXIT_LOCKED


class RepeatedIds(SinkError):
    """``teibatch validate`` found an id in more than one row of the output's committed vectors parts.

    A run writes each id once (a later record with an id already held is a ``duplicate_id`` reject);
    parts written by hand, or by a teibatch older than that rule, may not. The message names the ids
    and the parts and rows holding them: remove the extra rows, or run the job again into a new
    ``output.path``.
    """

    exit_code = EXIT_REFUSED


class StorageFull(SinkError):
    """The output's storage is full: no space left on the disk (``ENOSPC``), a disk quota reached
    (``EDQUOT``), or an object store's quota or "storage full" answer. With ``temporary`` it is the
    shard tasks' temporary directory (``TMPDIR``) instead, where each running shard encodes its part.

    ``path`` names the full location; ``needed_bytes`` estimates how much more the run needs
    (``None`` before anything says). Committed shards stay committed: make that much room, or
    raise the quota, then run the same command again; it resumes.
    """

    def __init__(self, message: str, *, path: str, needed_bytes: int | None = None,
                 temporary: bool = False) -> None:
        self.path = path
        self.needed_bytes = needed_bytes
        self.temporary = temporary
        super().__init__(message)


class RunIncomplete(TeibatchError):
    """Some shards were not committed; run the same command again to finish them."""


class RejectsFound(TeibatchError):
    """``run --fail-on-rejects``: the run finished, but some documents were rejected (see ``rejects/``)."""


class RayUnavailable(TeibatchError):
    """Ray could not be started, or the cluster named by ``--ray-address``/``RAY_ADDRESS`` could not be
    joined (unreachable, another Ray version). Nothing was embedded; the same command resumes."""


class SenderFailed(TeibatchError):
    """A chunk could not be embedded because its sender (the process that talks to the servers) kept
    dying; the shard is not committed, and the same command sends it again."""


class FleetError(TeibatchError):
    """Servers could not be launched, reached, exported or destroyed."""


class CapacityUnavailable(FleetError):
    """No server could be started, or none stayed healthy long enough to run the job."""


class TeardownIncomplete(FleetError):
    """Something launched could not be destroyed; ``teibatch fleet sweep`` retries it.

    This is the one error that may cost money: read the message, it names what is still running.
    """


class ExportFailed(TeardownIncomplete):
    """A server volume could not be copied off, or its copy did not match its checksums.

    Nothing that holds data was destroyed (containers were removed, hosts and volumes kept): fix the
    destination and run ``teibatch fleet sweep`` (it exports again, then destroys), or run
    ``teibatch fleet sweep --waive-export`` to destroy without a copy.
    """


class GpuUnsupported(FleetError):
    """A host's GPU cannot serve the job: compute capability below 7.5, no TEI image for its
    architecture or platform, or too little memory for the model.

    Rent another card (``teibatch gpus`` lists them), or set ``servers.image`` to choose an image.
    """


class FleetTimeout(FleetError):
    """A fleet wait passed its deadline (``what`` says which, ``seconds`` how long it waited).

    Raise ``servers.startup_timeout`` (or ``export.timeout``) if the hosts are only slow.
    """

    def __init__(self, message: str, *, what: str, seconds: float) -> None:
        self.what = what
        self.seconds = seconds
        super().__init__(message)


class CloudApiError(FleetError):
    """A GPU cloud's API answered a call with an error; ``status_code`` is its HTTP status.

    ``retryable`` (a 429 or 5xx: the cloud's own trouble) means the call may be tried again, and that
    a create call may still have made its instance: teibatch looks it up by name. Any other status
    is the cloud refusing the call: the message quotes its reason (a wrong key, a bad request).
    """

    def __init__(self, message: str, *, status_code: int) -> None:
        self.status_code = status_code
        super().__init__(message)

    @property
    def retryable(self) -> bool:
        return self.status_code == 429 or self.status_code >= 500


class RateLimited(CloudApiError):
    """A GPU cloud's API kept answering 429 (too many requests) after teibatch waited as its ``Retry-After``
    (or ``RateLimit``) header asked, for as long as it waits for one call; ``retry_after`` is the last wait
    the cloud asked for, in seconds (``None`` when it named none).

    Never read as "no capacity" nor as a failed terminate: the cloud did not process the call. A run
    stops renting more; teardown goes on polling; ``teibatch fleet sweep`` can be run again later.
    """

    def __init__(self, message: str, *, retry_after: float | None) -> None:
        self.retry_after = retry_after
        super().__init__(message, status_code=429)


class SshError(FleetError):
    """An SSH connection or a command run over SSH failed; ``host`` names the host, ``exit_status``
    is the command's exit status (255: SSH itself failed)."""

    def __init__(self, message: str, *, host: str, exit_status: int | None = None) -> None:
        self.host = host
        self.exit_status = exit_status
        super().__init__(f"{host}: {message}")


class HostUnreachable(SshError):
    """SSH could not connect or log in: check the address, port, user, key file and jump host."""


class HostKeyRejected(SshError):
    """The host's SSH key is unknown or changed: add it to the known_hosts file, or set the host's
    ``host_key_checking: accept-new`` if you trust the network to this freshly rented host."""


class RemoteCommandFailed(SshError):
    """A command on the host (``docker``, ``nvidia-smi``, ``tar``) exited with an error; the message
    ends with the end of its output (secrets removed)."""
