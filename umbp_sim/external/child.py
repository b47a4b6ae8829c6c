"""The process that hosts an external allocator: ``python -m umbp_sim.external.child SPEC``.

It imports the allocator once (a module with mori's Python API, or an extension module at a
path), then serves runs: for each ``Run`` read from stdin it forks, and the forked child, a fresh
process as far as the allocator's once-flags and registries are concerned, builds the simulated
host, activates the interposer on it and calls the allocator; its stdout and stderr (the
allocator's log) go to a file, its progress and result to a pipe. The server waits for it and
answers with what it saw, the exit status included, so a real SIGBUS is data.

Protocol on stdin/stdout: 4-byte big-endian length + pickle, both ways. The first message from
the server is ``{"ready": True, "mode": ..., "objects": [...]}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import pickle
import re
import struct
import sys
import tempfile
import traceback
from typing import Any, BinaryIO

_SYSTEM_LIB = re.compile(
    r"/(ld-linux[^/]*|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libpython[^/]*|"
    r"libz|libffi|libutil|libcrypt)[.-][^/]*$"
)


def send(out: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def recv(inp: BinaryIO) -> Any:
    head = inp.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = struct.unpack(">I", head)
    return pickle.loads(inp.read(n))


def loaded_objects() -> list[str]:
    """Paths of the shared objects mapped in this process, in first-seen order."""
    seen: dict[str, None] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                seen.setdefault(parts[5].strip(), None)
    return list(seen)


def load_allocator(spec: dict[str, str]) -> Any:
    """The module holding UMBPHostMemAllocator / UMBPHostBufferBacking."""
    if spec["kind"] == "module":
        return importlib.import_module(spec["name"])
    path = spec["path"]
    base = os.path.basename(path).split(".")[0]
    names = [base] + ([base[3:]] if base.startswith("lib") else [])
    last: Exception | None = None
    for name in names:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        mod_spec = importlib.util.spec_from_loader(name, loader)
        assert mod_spec is not None
        try:
            module = importlib.util.module_from_spec(mod_spec)
            loader.exec_module(module)
            return module
        except ImportError as e:
            last = e
    raise ImportError(f"{path}: not a Python extension module with mori's API ({last})")


def allocator_objects(before: list[str], after: list[str], interposer: str) -> list[str]:
    """The objects the allocator's import brought in, without system libraries."""
    old = set(before)
    real_interposer = os.path.realpath(interposer)
    return [
        p
        for p in after
        if p not in old and not _SYSTEM_LIB.search(p) and os.path.realpath(p) != real_interposer
    ]


def serve(spec: dict[str, str]) -> int:
    from umbp_sim.capi import interposer_path
    from umbp_sim.external.interposer import Interposer

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    interposer = interposer_path()
    before = loaded_objects()
    try:
        module = load_allocator(spec)
        for attr in ("UMBPHostMemAllocator", "UMBPHostBufferBacking"):
            if not hasattr(module, attr):
                raise ImportError(f"{spec.get('name') or spec.get('path')}: no {attr}")
    except BaseException as e:  # noqa: BLE001 - reported to the parent as one line
        send(out, {"error": f"{type(e).__name__}: {e}"})
        return 2
    after = loaded_objects()
    wrapped = any(os.path.realpath(p) == os.path.realpath(interposer) for p in after) and (
        interposer not in os.environ.get("LD_PRELOAD", "")
    )
    preloaded = interposer in os.environ.get("LD_PRELOAD", "")
    if not wrapped and not preloaded:
        # A prebuilt module: start again with the interposer preloaded.
        env = dict(os.environ)
        # After what is preloaded already (a sanitizer runtime must come first).
        env["LD_PRELOAD"] = (env.get("LD_PRELOAD", "") + " " + interposer).strip()
        argv = [sys.executable, "-m", "umbp_sim.external.child", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)
    ip = Interposer(interposer)
    problem = ip.fault_path_problem()
    if problem:
        send(out, {"error": problem})
        return 2
    # What every run needs, imported once here: a forked child would import it each time.
    import umbp_sim.sim
    import umbp_sim.trace  # noqa: F401

    objects = allocator_objects(before, after, interposer)
    if spec["kind"] == "shared-object" and spec["path"] not in objects:
        objects.append(os.path.realpath(spec["path"]))
    for p in objects:
        ip.add_caller_object(p)
    send(out, {"ready": True, "mode": "wrap" if wrapped else "preload", "objects": objects})
    while True:
        try:
            run = recv(inp)
        except EOFError:
            return 0
        send(out, fork_run(module, ip, run))


def fork_run(module: Any, ip: Any, run: Any) -> dict[str, Any]:
    """Run in a forked child; collect its result, log, stages and exit status.

    ``run`` is an ``ObserveJob``: compare's alloc, write, free (kind "run", answered by
    ``run_job.run_in_child``) or a replay's request (answered as the scenario runner's
    ``Observed``).
    """
    from umbp_sim.external.observe import load_torch, observe_one

    if run.kind == "sglang":
        load_torch()  # once, in the server: not in every forked child

    def job(module: Any, ip: Any, run: Any, report: Any) -> dict[str, Any]:
        return {"observed": observe_one(module, ip, run, report)}

    log = tempfile.TemporaryFile()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(rfd)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            out = os.fdopen(wfd, "wb", buffering=0)

            def report(stage: str, **extra: Any) -> None:
                send(out, {"stage": stage, **extra})

            send(out, {"result": job(module, ip, run, report)})
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)
    os.close(wfd)
    stages: list[str] = []
    partial: dict[str, Any] = {}  # what the child reported on its way (kept if it dies)
    result: dict[str, Any] | None = None
    with os.fdopen(rfd, "rb") as pipe:
        while True:
            try:
                msg = recv(pipe)  # type: ignore[arg-type]
            except (EOFError, pickle.UnpicklingError, struct.error):
                break
            if "stage" in msg:
                stages.append(msg.pop("stage"))
                partial.update(msg)
            else:
                result = msg["result"]
    _, status = os.waitpid(pid, 0)
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    return {
        "result": result,
        "stages": stages,
        "partial": partial,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "log": text,
    }


def main() -> int:
    import json

    spec = json.loads(sys.argv[1])
    return serve(spec)


if __name__ == "__main__":
    sys.exit(main())
