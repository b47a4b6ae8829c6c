"""The analyst's RLIMIT_AS stays out of an external build's verdict (issue 26).

SimKernel gives a simulated mapping an unbacked address when umbp-sim's own process cannot
reserve real address space for it (docs/kernel-model.md section 6). The test allocator touches
its buffer by hand on kernel 5.10 (no MADV_POPULATE_WRITE), one write per page: at an unbacked
address that write is a real SIGSEGV. The allocator's processes raise their soft RLIMIT_AS to the
hard one first; when that is not enough the run could not run, in one line, and is no verdict.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

GiB = 1 << 30
LIMIT = 8 * GiB
D = Path(__file__).resolve().parent.parent / "data" / "replay"
REPLAY_16G = [str(D / "pool-on-node0-5.10.0"), "--size", "16GiB", "--backing", "Anonymous"]


def _limit_both() -> None:  # `ulimit -v 8G`: soft and hard
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _limit_soft() -> None:  # `ulimit -S -v 8G`: the hard limit stays unlimited
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, resource.RLIM_INFINITY))


def _run(argv: list[str], limit: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        preexec_fn=limit,  # type: ignore[arg-type]
    )  # fmt: skip


def _cli(*args: str, limit: object = None) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "umbp_sim.cli", *args], limit)


def _could_not_run(tiny: str) -> str:
    return (
        f"--allocator {tiny}: could not run: this process's RLIMIT_AS (ulimit -v 8GiB) leaves "
        "no real address space for the 16GiB buffer the allocator touches by hand; run "
        "umbp-sim without ulimit -v"
    )


def test_replay_under_the_analysts_limit_could_not_run(tiny_builds: dict[str, str]) -> None:
    tiny = tiny_builds["wrap"]
    argv = ["replay", *REPLAY_16G, "--json", "--allocator", tiny]
    free = _cli(*argv)
    assert free.returncode == 0, free.stderr
    verdict = json.loads(free.stdout)
    assert verdict["outcome"] == "ok", verdict
    # `ulimit -S -v 8G`: the allocator's processes raise it to the hard limit: the same verdict
    soft = _cli(*argv, limit=_limit_soft)
    assert soft.returncode == 0, soft.stderr
    assert json.loads(soft.stdout)["outcome"] == verdict["outcome"]
    # `ulimit -v 8G`: no verdict (was a SIGSEGV crash), one line naming the cause
    both = _cli(*argv, limit=_limit_both)
    assert (both.returncode, both.stdout) == (75, "")
    assert both.stderr == f"umbp-sim replay: {_could_not_run(tiny)}\n"
    pre = _cli("preflight", "--root", *REPLAY_16G, "--allocator", tiny, limit=_limit_both)
    assert (pre.returncode, pre.stdout) == (75, "")
    assert pre.stderr == f"umbp-sim preflight: {_could_not_run(tiny)}\n"


def test_compare_under_the_analysts_limit_could_not_run(tiny_builds: dict[str, str]) -> None:
    """compare's could-not-run path (exit 2 in the command): ``CouldNotRun`` with the line."""
    tiny = tiny_builds["wrap"]
    code = textwrap.dedent(
        f"""
        import json
        from umbp_sim.allocator_spec import parse_allocator_spec
        from umbp_sim.comparison.matrix import machine
        from umbp_sim.run_router import open_allocator
        from umbp_sim.engine.spec import Alloc, Run
        from umbp_sim.external.runner import CouldNotRun
        from umbp_sim.request import AllocRequest
        r = open_allocator(parse_allocator_spec({tiny!r}))
        work = Alloc(AllocRequest(16 << 30, "Anonymous"), write=True)
        run = Run(machine("ample", "5.10.0"), work, label="16G")
        try:
            print(json.dumps(["ok", r.run(run).outcome]))
        except CouldNotRun as e:
            print(json.dumps(["could not run", str(e)]))
        finally:
            r.close()
        """
    )
    free = _run([sys.executable, "-c", code], None)
    assert free.returncode == 0, free.stderr
    assert json.loads(free.stdout) == ["ok", "ok"]
    both = _run([sys.executable, "-c", code], _limit_both)
    assert both.returncode == 0, both.stderr
    want = _could_not_run(tiny).removeprefix("--allocator ")
    assert json.loads(both.stdout) == ["could not run", want]


def test_run_under_the_analysts_limit_fails_the_scenario_with_the_line(
    tiny_builds: dict[str, str], tmp_path: Path
) -> None:
    tiny = tiny_builds["wrap"]
    scenario = tmp_path / "big.toml"
    scenario.write_text(
        "umbp_sim_scenario = 1\n[scenario]\nname = 'big'\ndescription = 'd'\nsource = 's'\n"
        "[machine]\nnodes = 1\nmem_per_node = '64GiB'\nkernel_version = '5.10.0'\n"
        f"[request]\nkind = 'alloc'\nsize = {16 * GiB}\nbacking = 'Anonymous'\n"
        "[expect]\noutcome = 'ok'\n"
    )
    assert _cli("run", str(scenario), "--allocator", tiny).returncode == 0
    r = _cli("run", str(scenario), "--allocator", tiny, limit=_limit_both)
    assert r.returncode == 1, r.stderr
    line = _could_not_run(tiny).removeprefix(f"--allocator {tiny}: ")
    assert f"\n  {line}\n" in r.stdout
    assert r.stdout.splitlines()[1].split() == ["big", "ok", "could-not-run", "FAIL"]
