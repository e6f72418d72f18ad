"""Every option of the built-in TEI-compatible server, in one frozen record.

Defaults are TEI 1.9.3's (``router/src/main.rs``) where TEI has the option, so a client tuned
against this server behaves the same against a real TEI. Options TEI does not have (backend,
capacity model, fault injection, recording) default to "off".

The record is built once, by the ``serve`` command or by :func:`teibatch.server.testing.running_server`,
and validated in ``__post_init__`` so a wrong value fails before any socket is opened.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

TEI_VERSION = "1.9.3"

DEFAULT_MODEL_ID = "teibatch/hashing-384"
DEFAULT_DIMENSION = 384
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_MAX_INPUT_LENGTH = 512
DEFAULT_PAYLOAD_LIMIT = 2_000_000
DEFAULT_HOSTNAME = "127.0.0.1"
DEFAULT_BATCH_OVERHEAD_S = 0.002
CHARS_PER_TOKEN_LIMIT = 250
"""TEI refuses (or cuts) inputs longer than ``max_input_length * 250`` characters before tokenizing."""

BACKENDS = ("hashing", "sentence-transformers", "numpy")
MODEL_KINDS = ("embedding", "reranker")
POOLINGS = ("mean", "cls", "splade", "last_token")


@dataclass(frozen=True)
class FaultConfig:
    """Seeded fault injection, for tests of clients' retry and failover code.

    Each ``*_rate`` is the probability (0..1) that one inference request gets that fault instead of
    its answer; draws come from one ``random.Random(seed)``, so a run is repeatable for a given order
    of requests. ``hang_after`` and ``exit_after`` count inference requests (1-based): the request
    numbered ``hang_after`` never gets an answer; after ``exit_after`` answered requests the server
    stops listening and drops every connection (a crash, as a client sees it). ``tokenize`` draws for
    ``POST /tokenize`` too (TEI itself never answers 429 there; a proxy in front of it may).
    """

    seed: int = 0
    rate_429: float = 0.0
    rate_503: float = 0.0
    rate_424: float = 0.0
    rate_500: float = 0.0
    rate_drop: float = 0.0
    rate_latency: float = 0.0
    latency_s: float = 1.0
    hang_after: int | None = None
    exit_after: int | None = None
    tokenize: bool = False

    def __post_init__(self) -> None:
        rates = [self.rate_429, self.rate_503, self.rate_424, self.rate_500, self.rate_drop,
                 self.rate_latency]
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError("fault rates must be between 0 and 1")
        if self.rate_429 + self.rate_503 + self.rate_424 + self.rate_500 + self.rate_drop > 1.0:
            raise ValueError("the error and drop fault rates must add up to at most 1")
        if self.latency_s < 0:
            raise ValueError("latency_s must be >= 0")
        for name in ("hang_after", "exit_after"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def enabled(self) -> bool:
        """Whether any fault can fire; the fault layer is skipped entirely when not."""
        return bool(self.rate_429 or self.rate_503 or self.rate_424 or self.rate_500 or self.rate_drop
                    or self.rate_latency or self.hang_after or self.exit_after)


@dataclass(frozen=True)
class ServerConfig:
    """What one ``teibatch serve`` process serves and which limits it enforces.

    TEI's limits: ``max_client_batch_size`` (inputs per request), ``max_concurrent_requests``
    (inputs in flight, all requests together), ``max_batch_tokens`` (tokens per server-side batch),
    ``max_input_length`` (tokens per input, special tokens included), ``payload_limit`` (request
    body bytes), ``auto_truncate`` (what ``truncate: null`` means), ``api_key``.

    teibatch's own: ``backend`` (``hashing``: deterministic, no download; ``sentence-transformers``:
    a real model, extra ``st``; ``numpy``: a BERT sentence model without torch, extra ``minilm``),
    ``model_kind`` (``embedding`` or ``reranker``), ``pooling``
    (``splade`` turns on ``/embed_sparse``), ``simulate_gpu`` (tokens/s of a pretend GPU; ``None``
    answers as fast as the CPU computes), ``batch_overhead_s`` (fixed time per simulated batch),
    ``record_texts`` (keep a digest multiset of embedded texts for ``/teibatch/stats``), ``faults``.
    """

    model_id: str = DEFAULT_MODEL_ID
    served_model_name: str | None = None
    revision: str | None = None
    dimension: int = DEFAULT_DIMENSION
    backend: str = "hashing"
    model_kind: str = "embedding"
    pooling: str = "mean"
    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_requests: int | None = None
    max_input_length: int = DEFAULT_MAX_INPUT_LENGTH
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    auto_truncate: bool = True
    api_key: str | None = field(default=None, repr=False)
    hostname: str = DEFAULT_HOSTNAME
    port: int = 0
    tokenization_workers: int = 1
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    default_prompt: str | None = None
    simulate_gpu: float | None = None
    batch_overhead_s: float = DEFAULT_BATCH_OVERHEAD_S
    record_texts: bool = False
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind must be one of {', '.join(MODEL_KINDS)}, not {self.model_kind!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        for name in ("dimension", "max_client_batch_size", "max_concurrent_requests", "max_batch_tokens",
                     "max_input_length", "payload_limit", "tokenization_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_batch_requests is not None and self.max_batch_requests < 1:
            raise ValueError("max_batch_requests must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be between 0 and 65535")
        if self.max_input_length > self.max_batch_tokens and not self.auto_truncate:
            # TEI refuses to start in this case too (router/src/lib.rs).
            raise ValueError("max_input_length must be <= max_batch_tokens when auto_truncate is false")
        if self.simulate_gpu is not None and self.simulate_gpu <= 0:
            raise ValueError("simulate_gpu must be > 0 tokens/s")
        if self.batch_overhead_s < 0:
            raise ValueError("batch_overhead_s must be >= 0")
        if self.default_prompt_name is not None and self.default_prompt is not None:
            raise ValueError("default_prompt_name and default_prompt are mutually exclusive")
        if self.default_prompt_name is not None and self.default_prompt_name not in dict(self.prompts):
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not among the prompts")

    @property
    def model_name(self) -> str:
        """The name /info and the OpenAI route report: ``served_model_name``, else ``model_id``."""
        return self.served_model_name or self.model_id

    @property
    def effective_max_input_length(self) -> int:
        """TEI caps ``max_input_length`` to ``max_batch_tokens`` when auto-truncating."""
        if self.auto_truncate:
            return min(self.max_input_length, self.max_batch_tokens)
        return self.max_input_length

    def with_options(self, **options: Any) -> ServerConfig:
        """A copy with some options changed; ``faults`` may be given as a dict of FaultConfig fields."""
        faults = options.pop("faults", None)
        if isinstance(faults, dict):
            options["faults"] = replace(self.faults, **faults)
        elif faults is not None:
            options["faults"] = faults
        return replace(self, **options)


def config_from_options(**options: Any) -> ServerConfig:
    """Build a ServerConfig from keyword options, accepting ``faults`` as a dict and ``fault_*`` keys.

    ``fault_rate_429=0.1`` is the same as ``faults={"rate_429": 0.1}``; unknown keys raise TypeError.
    """
    fault_names = {f.name for f in fields(FaultConfig)}
    faults = dict(options.pop("faults", None) or {})
    for key in list(options):
        if key.startswith("fault_") and key[len("fault_"):] in fault_names:
            faults[key[len("fault_"):]] = options.pop(key)
    if "prompts" in options and isinstance(options["prompts"], dict):
        options["prompts"] = tuple(options["prompts"].items())
    return ServerConfig(faults=FaultConfig(**faults), **options)
