"""Builtin sample corpora: real English text every Python installation carries, read at run time.

``builtin:stdlib-docs`` is the docstrings of a fixed list of standard-library modules (module,
class, function and method docstrings) plus the help topics of ``pydoc_data.topics``: a few
thousand documents, no download and no data file in the repository. The quickstart job and the
tests use it so they work on a fresh machine without network.

``builtin:stdlib-source`` is a corpus of long documents: one per module source file of the
standard library (``json.decoder`` is ``json/decoder.py``; a package is its ``__init__.py``), the
file's whole source as text, from a few hundred to tens of thousands of tokens. Test suites,
``site-packages`` and files that are not importable modules (a folder or file name that is not an
identifier) are left out, and so are empty files. Each record has ``title`` (the module name, also
its id) and ``path`` (relative to the standard library's folder).

The records are the same for the same Python version: modules are walked in a fixed order,
names in sorted order, each object once, and memory addresses (``0x7f...``) are masked in
docstrings.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import re
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from teibatch.errors import CorpusMismatch

BUILTIN_PREFIX = "builtin:"
BUILTIN_ID_FIELD = "id"
"""The field builtin records carry their natural id in; used when the job sets no ``id_field``."""

MIN_DOC_CHARS = 40
"""Docstrings shorter than this (``"Return self."``, generated dataclass reprs) are left out."""

# Standard-library modules present on CPython 3.10-3.13 on Linux that import without side effects
# (modules without Python source are skipped when read).
# Fixed and sorted: the corpus must not depend on what else happens to be installed or imported.
STDLIB_DOC_MODULES: tuple[str, ...] = (
    "abc", "argparse", "array", "ast", "asyncio.base_events", "asyncio.base_futures", "asyncio.coroutines",
    "asyncio.events", "asyncio.exceptions", "asyncio.format_helpers", "asyncio.futures", "asyncio.locks",
    "asyncio.protocols", "asyncio.queues", "asyncio.runners", "asyncio.selector_events", "asyncio.sslproto",
    "asyncio.staggered", "asyncio.streams", "asyncio.subprocess", "asyncio.tasks", "asyncio.transports",
    "asyncio.trsock", "asyncio.unix_events", "atexit", "base64", "bdb", "binascii", "bisect", "builtins",
    "bz2", "calendar", "cmath", "cmd", "code", "codecs", "codeop", "collections", "collections.abc",
    "colorsys", "compileall", "concurrent.futures", "concurrent.futures._base",
    "concurrent.futures.process", "concurrent.futures.thread", "configparser", "contextlib", "copy",
    "copyreg", "csv", "ctypes", "dataclasses", "datetime", "dbm", "dbm.dumb", "difflib", "dis", "doctest",
    "email.base64mime", "email.charset", "email.contentmanager", "email.encoders", "email.errors",
    "email.feedparser", "email.generator", "email.header", "email.headerregistry", "email.iterators",
    "email.message", "email.mime.application", "email.mime.multipart", "email.mime.text", "email.parser",
    "email.policy", "email.quoprimime", "email.utils", "encodings.punycode", "enum", "faulthandler",
    "fcntl", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "getopt",
    "getpass", "gettext", "glob", "graphlib", "grp", "gzip", "hashlib", "heapq", "hmac", "html",
    "html.parser", "http", "http.client", "http.cookiejar", "http.cookies", "http.server", "imaplib",
    "importlib", "importlib.abc", "importlib.machinery", "importlib.metadata", "importlib.resources",
    "importlib.util", "inspect", "io", "ipaddress", "itertools", "json", "json.decoder", "json.encoder",
    "keyword", "linecache", "locale", "logging", "logging.config", "logging.handlers", "lzma", "mailbox",
    "marshal", "math", "mimetypes", "mmap", "modulefinder", "multiprocessing.connection",
    "multiprocessing.context", "multiprocessing.heap", "multiprocessing.managers", "multiprocessing.pool",
    "multiprocessing.process", "multiprocessing.queues", "multiprocessing.reduction",
    "multiprocessing.shared_memory", "multiprocessing.synchronize", "multiprocessing.util", "netrc",
    "numbers", "opcode", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "pty", "pwd",
    "py_compile", "pyclbr", "pydoc", "queue", "quopri", "random", "re", "reprlib", "resource",
    "rlcompleter", "runpy", "sched", "secrets", "select", "selectors", "shelve", "shlex", "shutil",
    "signal", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "stat", "statistics", "string",
    "stringprep", "subprocess", "symtable", "sys", "sysconfig", "tabnanny", "tarfile", "tempfile",
    "textwrap", "threading", "time", "timeit", "token", "tokenize", "trace", "traceback", "tracemalloc",
    "tty", "types", "typing", "unicodedata", "unittest.async_case", "unittest.case", "unittest.loader",
    "unittest.main", "unittest.mock", "unittest.result", "unittest.runner", "unittest.suite",
    "unittest.util", "urllib.error", "urllib.parse", "urllib.request", "urllib.response",
    "urllib.robotparser", "uuid", "venv", "warnings", "wave", "weakref", "webbrowser", "wsgiref.handlers",
    "wsgiref.headers", "wsgiref.simple_server", "wsgiref.util", "wsgiref.validate", "xml.dom",
    "xml.dom.domreg", "xml.dom.expatbuilder", "xml.dom.minicompat", "xml.dom.minidom", "xml.dom.pulldom",
    "xml.etree.ElementTree", "xml.sax", "xml.sax.expatreader", "xml.sax.handler", "xml.sax.saxutils",
    "xml.sax.xmlreader", "xmlrpc.client", "xmlrpc.server", "zipapp", "zipfile", "zipimport", "zlib",
    "zoneinfo"
)

STDLIB_SKIPPED_FOLDERS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages"})
"""Folders of the standard library's tree that ``builtin:stdlib-source`` leaves out: test suites
(thousands of files, some deliberately broken) and installed third-party packages."""

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@dataclass(frozen=True)
class BuiltinCorpus:
    """One builtin corpus: its ``name`` (after ``builtin:``) and the rows it serves."""

    name: str
    records: tuple[dict[str, str], ...]
    fingerprint: str

    @property
    def source(self) -> str:
        return BUILTIN_PREFIX + self.name


def is_builtin(path: str) -> bool:
    """Whether a corpus path names a builtin corpus (``builtin:<name>``)."""
    return path.startswith(BUILTIN_PREFIX)


def load_builtin(path: str) -> BuiltinCorpus:
    """The builtin corpus ``path`` names, built once per process; unknown names raise ``CorpusMismatch``."""
    name = path.removeprefix(BUILTIN_PREFIX)
    build = _BUILDERS.get(name)
    if build is None:
        known = ", ".join(BUILTIN_PREFIX + n for n in sorted(_BUILDERS))
        raise CorpusMismatch(f"no such builtin corpus (known: {known})", file=path)
    return _cached(name, build)


@functools.cache
def _cached(name: str, build: Callable[[], Iterator[dict[str, str]]]) -> BuiltinCorpus:
    records = tuple(build())
    digest = hashlib.blake2b(digest_size=8)
    for record in records:
        digest.update(record["id"].encode())
        digest.update(b"\0")
        digest.update(record["text"].encode())
        digest.update(b"\0")
    version = ".".join(str(part) for part in sys.version_info[:3])
    return BuiltinCorpus(name, records, f"python-{version}:{len(records)}:{digest.hexdigest()}")


def stdlib_docs() -> Iterator[dict[str, str]]:
    """Docstrings of ``STDLIB_DOC_MODULES`` then ``pydoc_data`` topics, in a fixed order.

    Docstrings are read from the modules' source files with :mod:`ast`, never from imported
    objects: what a process has imported or patched (a test runner, a library) must not change
    the corpus, since the driver and every Ray worker build it independently. Modules without
    Python source (C extensions) are left out for the same reason.
    """
    for module_name in STDLIB_DOC_MODULES:
        tree = _parse_module(module_name)
        if tree is not None:
            yield from _module_docs(module_name, tree)
    yield from _topics()


_PARSING = threading.Lock()


def _parse_module(name: str) -> ast.Module | None:
    """The syntax tree of a stdlib module's source, or ``None`` when this Python has no source for it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    try:
        source = Path(origin).read_text(encoding="utf-8")
        # One parse at a time: the shards of one task read side by side in threads, and CPython's
        # ast module can fail with "AST constructor recursion depth mismatch" when two
        # threads parse at once (CPython issue 106905); warnings.catch_warnings is process-wide state too.
        with _PARSING, warnings.catch_warnings():  # old modules carry invalid escape sequences
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _module_docs(name: str, tree: ast.Module) -> Iterator[dict[str, str]]:
    yield from _record(name, name, ast.get_docstring(tree, clean=False), "module")
    for node in _public_definitions(tree.body):
        yield from _record(f"{name}:{node.name}", f"{name}.{node.name}",
                           ast.get_docstring(node, clean=False), "docstring")
        if isinstance(node, ast.ClassDef):
            for member in _public_definitions(node.body, classes=False):
                yield from _record(f"{name}:{node.name}.{member.name}", f"{name}.{node.name}.{member.name}",
                                   ast.get_docstring(member, clean=False), "docstring")


def _public_definitions(body: list[ast.stmt], *, classes: bool = True,
                        ) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Public functions (and classes) defined directly in ``body``; of a name defined twice, the first."""
    seen: set[str] = set()
    for node in body:
        if not isinstance(node, _DEFINITIONS) or node.name.startswith("_") or node.name in seen:
            continue
        if isinstance(node, ast.ClassDef) and not classes:
            continue
        seen.add(node.name)
        yield node


def _record(doc_id: str, title: str, doc: object, source: str) -> Iterator[dict[str, str]]:
    """The record of one docstring; none when it is missing or shorter than :data:`MIN_DOC_CHARS`."""
    if not isinstance(doc, str):
        return
    text = _ADDRESS.sub("0x...", inspect.cleandoc(doc)).strip()
    if len(text) >= MIN_DOC_CHARS:
        yield {"id": doc_id, "text": text, "source": source, "title": title}


def _topics() -> Iterator[dict[str, str]]:
    try:
        from pydoc_data.topics import topics as table
    except ImportError:  # some distributions strip pydoc_data
        return
    for name in sorted(table):
        yield from _record(f"topic:{name}", name, table[name], "topic")


def stdlib_source() -> Iterator[dict[str, str]]:
    """One record per standard-library module source file, sorted by path (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).parts):
        relative = path.relative_to(root)
        folders = relative.parts[:-1]
        if any(folder in STDLIB_SKIPPED_FOLDERS or not folder.isidentifier() for folder in folders) \
                or not path.stem.isidentifier():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip():
            continue
        module = ".".join(folders) if path.stem == "__init__" else ".".join((*folders, path.stem))
        if module:
            yield {"id": module, "text": text, "title": module, "path": relative.as_posix()}


_BUILDERS: dict[str, Callable[[], Iterator[dict[str, str]]]] = {
    "stdlib-docs": stdlib_docs,
    "stdlib-source": stdlib_source,
}
