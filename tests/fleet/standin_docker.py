"""A stand-in ``docker`` (and ``nvidia-smi``) for the fleet tests: no engine, real processes.

Installed by ``conftest.py`` as ``<dir>/bin/docker`` and ``<dir>/bin/nvidia-smi`` with this Python as
interpreter; the test sshd puts ``<dir>/bin`` first on PATH and ``STANDIN_STATE`` in the environment.
``docker run -d`` starts ``python -m teibatch serve`` (wrapped in ``timeout`` like the real entrypoint)
on the requested loopback port; containers are JSON files under ``$STANDIN_STATE/containers``. Every
call is appended to ``calls.jsonl`` (arguments only: the API key travels in the environment, and the
stand-in records only whether it was set). To let tests check that the key leaks nowhere, the key it
received is written to ``witness/`` — the one place tests skip when they grep for it.

The stand-in images have TEI's entrypoints (:func:`image_entrypoint`: ``/entrypoint.sh`` in the CUDA
images, the router in the CPU ones); a container whose image entrypoint ran (as is, or as the program
``--entrypoint timeout`` runs) is recorded as such in ``entrypoints.jsonl``, one that bypassed it too
(:func:`record_entrypoint`), so a test fails when a provider skips it.

Behaviour is set by ``$STANDIN_STATE/config.json``: ``gpu`` (nvidia-smi lines, or null: no GPU),
``fail_run`` (docker run fails), ``never_healthy`` (the container runs but never answers), ``run_delay_s``
(``docker run`` takes that long first, as on a busy host: tests show they do not depend on its speed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("STANDIN_STATE", "/tmp/standin-docker"))
PYTHON = sys.executable
DEFAULT_GPU = "NVIDIA GeForce RTX 4090, 8.9, 24564 MiB"


def config() -> dict:
    try:
        return json.loads((STATE / "config.json").read_text())
    except FileNotFoundError:
        return {}


def record(tool: str, argv: list[str]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"tool": tool, "argv": argv, "api_key_in_env": bool(os.environ.get("API_KEY")),
                       "at": time.time()})
    with open(STATE / "calls.jsonl", "a") as handle:
        handle.write(line + "\n")


def image_entrypoint(image: str) -> str:
    """The stand-in image's own entrypoint, as TEI's images have it: the CPU images start the router."""
    return "text-embeddings-router" if image.rpartition(":")[2].startswith("cpu") else "/entrypoint.sh"


def record_entrypoint(state: Path, name: str, image: str, program: str) -> None:
    """Record which program container ``name`` started with, and whether it is the image's own entrypoint."""
    state.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"name": name, "image": image, "program": program, "ran": program == image_entrypoint(image)})
    with open(state / "entrypoints.jsonl", "a") as handle:
        handle.write(line + "\n")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def containers() -> list[dict]:
    found = []
    for path in sorted((STATE / "containers").glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def find(ref: str) -> dict | None:
    return next((c for c in containers() if ref in (c["name"], c["id"])), None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fake_download(volume: str, model: str) -> None:
    """What TEI does on first start: the model into the HF cache on /data (blobs + snapshot symlinks)."""
    downloaded = hub_files(volume, model)
    with open(STATE / "downloads.jsonl", "a") as handle:
        handle.write(json.dumps({"model": model, "downloaded": downloaded}) + "\n")


def hub_files(volume: str, model: str) -> bool:
    """Write a stand-in of ``model`` into the HF cache at ``volume``, unless it is there; whether it was written."""
    repo = Path(volume) / f"models--{model.replace('/', '--')}"
    weights = repo / "snapshots" / "main" / "model.safetensors"
    downloaded = not weights.exists()
    if downloaded:
        content = hashlib.sha256(model.encode()).digest() * 2048  # 64 KiB
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        weights.parent.mkdir(parents=True, exist_ok=True)
        weights.symlink_to(os.path.relpath(blob, weights.parent))
        (repo / "snapshots" / "main" / "config.json").write_text(json.dumps({"model": model}))
    return downloaded


def run(args: list[str]) -> int:
    options: dict[str, list[str]] = {}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("-d", "--detach", "--rm"):
            continue
        options.setdefault(flag, []).append(rest.pop(0))
    image, command = rest[0], rest[1:]
    time.sleep(float(config().get("run_delay_s", 0)))
    if config().get("fail_run"):
        print("docker: Error response from daemon: could not select device driver with capabilities: [[gpu]]",
              file=sys.stderr)
        return 125
    name = options["--name"][0]
    if find(name):
        print(f"docker: Error response from daemon: Conflict. The container name {name} is already in use",
              file=sys.stderr)
        return 125
    deadline, program = None, options.get("--entrypoint", [image_entrypoint(image)])[0]
    if program == "timeout":
        while command and command[0] == "-k":
            command = command[2:]
        deadline, program, command = command[0], command[1], command[2:]  # "<N>s", "/entrypoint.sh"
    record_entrypoint(STATE, name, image, program)
    host, _, port = options["-p"][0].rpartition(":")[0].rpartition(":")
    port = int(port) if port else free_port()
    volume = options["-v"][0].rsplit(":", 1)[0]
    model = command[command.index("--model-id") + 1] if "--model-id" in command else "teibatch/hashing-384"
    fake_download(volume, model)
    env = dict(os.environ)
    if "API_KEY" in options.get("-e", []) and os.environ.get("API_KEY"):
        (STATE / "witness").mkdir(parents=True, exist_ok=True)
        (STATE / "witness" / "api_key").write_text(os.environ["API_KEY"])
    else:
        env.pop("API_KEY", None)
    if config().get("never_healthy"):
        server = ["sleep", "3600"]
    else:
        server = [PYTHON, "-m", "teibatch", "serve", "--hostname", host or "127.0.0.1", "--port", str(port),
                  *command]
    wrapper = ["timeout", "-k", "5", deadline] if deadline else []
    (STATE / "logs").mkdir(parents=True, exist_ok=True)
    log = open(STATE / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen([*wrapper, *server], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                               start_new_session=True)
    cid = hashlib.sha256(f"{name}{time.time()}".encode()).hexdigest()[:12]
    labels = dict(label.partition("=")[::2] for label in options.get("--label", []))
    entry = {"name": name, "id": cid, "pid": process.pid, "port": port, "volume": volume, "image": image,
             "labels": labels, "deadline": deadline, "gpus": options.get("--gpus", [None])[0]}
    (STATE / "containers").mkdir(parents=True, exist_ok=True)
    (STATE / "containers" / f"{name}.json").write_text(json.dumps(entry))
    print(cid)
    return 0


def remove(refs: list[str]) -> int:
    for ref in refs:
        entry = find(ref)
        if entry is None:
            continue  # like `docker rm -f`: nothing to do
        if alive(entry["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry["pid"], signal.SIGTERM)
            for _ in range(50):
                if not alive(entry["pid"]):
                    break
                time.sleep(0.1)
            else:
                os.killpg(entry["pid"], signal.SIGKILL)
        (STATE / "containers" / f"{entry['name']}.json").unlink(missing_ok=True)
        print(entry["name"])
    return 0


def ps(args: list[str]) -> int:
    show_all, quiet, filters, template = "-a" in args, "-q" in args, [], "{{.ID}}\t{{.Names}}"
    for index, arg in enumerate(args):
        if arg == "--filter":
            filters.append(args[index + 1])
        elif arg == "--format":
            template = args[index + 1]
    for entry in containers():
        state = "running" if alive(entry["pid"]) else "exited"
        if not show_all and state != "running":
            continue
        ok = True
        for spec in filters:
            kind, _, value = spec.partition("=")
            key, _, wanted = value.partition("=")
            if kind == "label" and entry["labels"].get(key) != wanted:
                ok = False
            if kind == "name" and value not in entry["name"]:
                ok = False
        if not ok:
            continue
        if quiet:
            print(entry["id"])
        else:
            print(template.replace("{{.Names}}", entry["name"]).replace("{{.State}}", state)
                  .replace("{{.ID}}", entry["id"]).replace("\\t", "\t"))
    return 0


def docker(argv: list[str]) -> int:
    record("docker", argv)
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "run":
        return run(args)
    if command == "rm":
        return remove([a for a in args if not a.startswith("-")])
    if command == "stop":
        for ref in args:
            entry = find(ref)
            if entry and alive(entry["pid"]):
                os.killpg(entry["pid"], signal.SIGTERM)
        return 0
    if command == "ps":
        return ps(args)
    if command == "port":
        entry = find(args[0])
        if entry is None:
            print(f"Error: No such container: {args[0]}", file=sys.stderr)
            return 1
        print(f"127.0.0.1:{entry['port']}")
        return 0
    if command == "logs":
        entry = find(args[-1])
        if entry is None:
            return 1
        lines = (STATE / "logs" / f"{entry['name']}.log").read_text(errors="replace").splitlines()
        tail = int(args[args.index("--tail") + 1]) if "--tail" in args else len(lines)
        print("\n".join(lines[-tail:]))
        return 0
    if command == "inspect":
        entry = find(args[-1])
        print(json.dumps([{"Name": entry["name"], "State": {"Running": alive(entry["pid"])}}] if entry else []))
        return 0 if entry else 1
    if command == "info":
        print("28.0.0-standin")
        return 0
    print(f"standin docker: unsupported command {command!r}", file=sys.stderr)
    return 2


def nvidia_smi(argv: list[str]) -> int:
    record("nvidia-smi", argv)
    gpu = config().get("gpu", DEFAULT_GPU)
    if gpu is None:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", file=sys.stderr)
        return 9
    lines = gpu.splitlines()
    if "-i" in argv:
        lines = [lines[int(argv[argv.index("-i") + 1])]]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    tool = Path(sys.argv[0]).name
    sys.exit(nvidia_smi(sys.argv[1:]) if tool == "nvidia-smi" else docker(sys.argv[1:]))
