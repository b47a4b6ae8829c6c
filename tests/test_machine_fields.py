"""One host description: Machine's field declarations (umbp_sim.machine.MACHINE_FIELDS) against
the native SimConfig binding, its .pyi stub, the scenario keys and their documentation, and a
dump round trip (Machine -> rendered /proc and /sys -> dump loader -> Machine) that keeps every
field a dump carries."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import isolated_child_env
from hypothesis import HealthCheck, given, settings, strategies as st

import umbp_sim
from umbp_sim import _native
from umbp_sim.collect_scripts import script_text
from umbp_sim.dump import load_dump
from umbp_sim.explore.schedule_to_scenario import write_scenario
from umbp_sim.live_dump import collect
from umbp_sim.machine import (
    BUILD_KEYWORDS,
    MACHINE_FIELDS,
    SIM_CONFIG_DERIVED,
    KiB,
    Machine,
    MiB,
)
from umbp_sim.scenario.scenario_run import build_machine
from umbp_sim.scenario.schema import MACHINE_KEYS, load_scenario
from umbp_sim.sim import SimHost, start_numbers, to_sim_config
from umbp_sim.strategies import PRESETS, machines

ROOT = Path(__file__).resolve().parent.parent
# Fields a dump cannot carry: the loader takes the default and says so in a note.
NOT_IN_A_DUMP: set[str] = set()  # every field has a file of a dump that carries it


def declared_config() -> dict[str, str]:
    """{SimConfig field: stub type} as MACHINE_FIELDS and SIM_CONFIG_DERIVED declare them."""
    out = {f.cxx: f.cxx_type for f in MACHINE_FIELDS if f.cxx is not None}
    return {**out, **SIM_CONFIG_DERIVED}  # type: ignore[dict-item]


def stub_config() -> dict[str, str]:
    """{field: annotation} of class SimConfig in the installed _native.pyi."""
    tree = ast.parse((Path(umbp_sim.__file__).parent / "_native.pyi").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SimConfig"]
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_binding_stub_and_declarations_agree_field_by_field() -> None:
    declared = declared_config()
    bound = {n for n in dir(_native.SimConfig) if not n.startswith("_")}
    assert bound == set(declared)
    assert stub_config() == declared
    cfg = _native.SimConfig()
    for name, typ in declared.items():
        base = {"int": int, "bool": bool, "str": str}.get(typ, list if "list" in typ else dict)
        value = getattr(cfg, name)
        assert isinstance(value, base) and (base is bool) == isinstance(value, bool), name


def test_every_field_is_declared_once_with_unit_doc_and_dump() -> None:
    names = [f.name for f in MACHINE_FIELDS]
    assert len(names) == len(set(names))
    assert all(f.doc for f in MACHINE_FIELDS)
    assert {f.name for f in MACHINE_FIELDS if f.dump is None} == NOT_IN_A_DUMP
    fresh = Machine()
    assert all(getattr(fresh, f.name) == f.default for f in MACHINE_FIELDS)


def test_scenario_keys_derive_from_the_declarations_and_are_documented() -> None:
    assert MACHINE_KEYS == {f.name for f in MACHINE_FIELDS} | BUILD_KEYWORDS | {
        "free_hugepages_per_node"
    }
    # scenarios/README.md's table is generated (tests/test_generated.py keeps it current)
    readme = (ROOT / "scenarios" / "README.md").read_text()
    section = readme.split("### `[machine]`")[1].split("\n### ")[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert sorted(documented) == sorted(MACHINE_KEYS)


def test_settable_from_a_machine_that_was_not() -> None:
    m = Machine.x86_64(hugetlb_cgroup_rsvd_max={"2MiB": "4MiB"}, root=False)
    cfg = to_sim_config(m)
    assert cfg.hugetlb_cgroup_rsvd_max == {2 * MiB: 4 * MiB} and cfg.root is False


# ---- round trip ------------------------------------------------------------------------------


def _distances(cfg: Any, n: Any) -> list[int]:
    # A node without distances renders the kernel's default (10 itself, 20 the others).
    return list(n.distances) or [10 if o == n.id else 20 for o in cfg.online_nodes]


def effective(m: Machine) -> dict[str, Any]:
    """Every Machine field as the simulator starts from it (None resolved to what it stands
    for: the numbers SimKernel derives are its start numbers), with nodes and pools as plain
    tuples; zero entries of size tables dropped."""
    cfg = to_sim_config(m)
    start = start_numbers(m)
    shown = "MemAvailable:" in SimHost(m).read("/proc/meminfo")  # SimKernel's 3.14 rule
    derived = {"mem_free": start.mem_free, "mem_available": start.mem_available,
               "mem_available_line": shown}  # fmt: skip
    out: dict[str, Any] = {}
    for f in MACHINE_FIELDS:
        value = getattr(cfg, f.cxx) if f.cxx and f.name != "nodes" else getattr(m, f.name)
        value = derived.get(f.name, value)
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v}
        out[f.name] = value
    out["nodes"] = [
        (n.id, n.mem_total, start.node(n.id).mem_free, start.node(n.id).page_cache,
         start.node(n.id).slab_reclaimable, n.cpulist, _distances(cfg, n),
         {s: (p.total, p.free, p.surplus) for s, p in n.hugepages.items()
          if p.total or p.free or p.surplus})
        for n in cfg.nodes
    ]  # fmt: skip
    return out


@st.composite
def dumpable_machines(draw: st.DrawFn, cpus: bool = True) -> Machine:
    """strategies.machines, plus the fields it leaves at their defaults, in a dump's units.
    Not ppc64le-radix: its rendered files (no cpuinfo, kernel string or collector record) show
    x86_64's sizes, 2 MiB and 1 GiB, and nothing else tells them apart (dump/arch.py)."""
    m = draw(machines(preset=st.sampled_from([p for p in PRESETS if p != "ppc64le-radix"])))
    kb = st.integers(0, 1 << 20).map(lambda n: n * KiB)
    # spread over the nodes by MemTotal (equal here): shares (and halves, in MemAvailable) in kB
    per_node_kb = st.integers(0, 1 << 12).map(lambda n: n * len(m.nodes) * 2 * KiB)
    sizes = st.sampled_from(m.hugepage_sizes)
    limit = st.dictionaries(sizes, st.integers(0, 8), max_size=2)
    extra_nodes = draw(st.lists(st.integers(len(m.nodes), 7), max_size=2))
    m.apply(
        swap_total=draw(kb),
        committed_as=draw(kb),
        page_cache=draw(per_node_kb),
        slab_reclaimable=draw(per_node_kb),
        watermark_low=draw(st.integers(0, 4096)) * m.page_size,
        mem_available_line=draw(st.sampled_from([None, True, False])),
        overcommit_kbytes=draw(st.sampled_from([0, 0, 1 << 20])),
        admin_reserve_kbytes=draw(st.sampled_from([8192, 0, 65536])),
        user_reserve_kbytes=draw(st.sampled_from([131072, 0])),
        hugetlb_cgroup_max={s: n * s for s, n in draw(limit).items()},
        hugetlb_cgroup_rsvd_max={s: n * s for s, n in draw(limit).items()},
        possible_nodes=sorted(set(m.node_ids()) | set(extra_nodes)) if extra_nodes else None,
    )
    for n in m.nodes:
        n.cpus = draw(st.sampled_from(["", f"{n.id * 4}-{n.id * 4 + 3}"])) if cpus else ""
    return m


def round_trip(m: Machine, tmp: Path) -> tuple[Machine, list[str]]:
    where = tmp / m.name
    SimHost(m).render(where)
    loaded, facts = load_dump(where)
    return loaded, facts.notes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumpable_machines())
def test_machine_render_parse_is_the_identity(
    tmp_path_factory: pytest.TempPathFactory, m: Machine
) -> None:
    loaded, _ = round_trip(m, tmp_path_factory.mktemp("dump"))
    before, after = effective(m), effective(loaded)
    for f in MACHINE_FIELDS:
        if f.name in NOT_IN_A_DUMP:
            continue
        assert after[f.name] == before[f.name], f.name


# The process's cgroup, as a host shows it: the root of a cgroup2 mount at /sys/fs/cgroup, where
# the rendered limit files are.
CGROUP_FILES = {
    "proc/self/cgroup": "0::/\n",
    "proc/self/mountinfo": "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
}


def collected_round_trip(m: Machine, tmp: Path, kind: str) -> Machine:
    """Machine -> rendered /proc and /sys -> a collector run against that tree (``kind``:
    ``umbp-sim collect``'s module, or the stand-alone collect.py or collect.sh) -> Machine."""
    root = tmp / "root"
    SimHost(m).render(root)
    for rel, text in CGROUP_FILES.items():
        (root / rel).write_text(text)
    out = tmp / "host.tar.gz"
    if kind == "module":
        collect(str(out), m.name, root=str(root))
    else:
        path = tmp / f"collect.{kind}"
        path.write_text(script_text(kind))
        cmd = [sys.executable, "-I", "-S", str(path)] if kind == "py" else ["dash", str(path)]
        args = ["--root", str(root), "--name", m.name, "-o", str(out)]
        done = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, cwd=tmp, env=isolated_child_env()
        )
        assert done.returncode == 0, done.stderr
    return load_dump(out)[0]


def assert_keeps_every_field(m: Machine, loaded: Machine) -> None:
    before, after = effective(m), effective(loaded)
    for f in MACHINE_FIELDS:
        if f.name not in NOT_IN_A_DUMP:
            assert after[f.name] == before[f.name], f.name


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumpable_machines())
def test_a_collected_dump_keeps_every_field(
    tmp_path_factory: pytest.TempPathFactory, m: Machine
) -> None:
    """The collectors gather every file the reader reads: Machine -> rendered host -> collect
    -> load_dump keeps every field a dump carries (admin_reserve_kbytes, ... included)."""
    loaded = collected_round_trip(m, tmp_path_factory.mktemp("collect"), "module")
    assert_keeps_every_field(m, loaded)


@pytest.mark.parametrize("kind", ["py", "sh"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=dumpable_machines())
def test_the_stand_alone_collectors_keep_every_field(
    tmp_path_factory: pytest.TempPathFactory, kind: str, m: Machine
) -> None:
    loaded = collected_round_trip(m, tmp_path_factory.mktemp("collect"), kind)
    assert_keeps_every_field(m, loaded)


def test_a_tarball_keeps_every_declared_file() -> None:
    """The tarball reader skips members no parser reads (dump/source.py's RELEVANT, a list of
    its own): none of the declared files of a dump is among them."""
    from umbp_sim.collect_scripts import standalone_collect as declared
    from umbp_sim.dump.source import relevant

    node = "sys/devices/system/node"
    files = [
        *(f"proc/{k}" for k in declared.PROC_FILES),
        *(f"proc/sys/vm/{k}" for k in declared.VM_SYSCTLS),
        *(f"{node}/{k}" for k in declared.NODE_LISTS),
        *(f"{node}/node3/{k}" for k in declared.NODE_FILES),
    ]
    assert [rel for rel in files if not relevant(rel)] == []


def test_a_collected_dump_carries_the_reserve_sysctls(tmp_path: Path) -> None:
    m = Machine.x86_64(admin_reserve_kbytes=0, user_reserve_kbytes=4096)
    loaded = collected_round_trip(m, tmp_path, "module")
    assert (loaded.admin_reserve_kbytes, loaded.user_reserve_kbytes) == (0, 4096)


def test_the_processs_credentials_round_trip_through_a_dump(tmp_path: Path) -> None:
    """root: the rendered proc/self/status's CapEff (what collect --pid records of a server)."""
    for root in (False, True):
        loaded, notes = round_trip(Machine.x86_64(root=root, name=f"r{root}"), tmp_path)
        assert loaded.root is root
        unprivileged = [n for n in notes if n.code == "credentials-unprivileged"]
        assert len(unprivileged) == (not root)


@pytest.mark.parametrize(
    ("status", "root", "says"),
    [
        # A uid in other scripts' digits is no uid (str.isdigit takes '²'): read as unreadable.
        ("Uid:\t0\t²\t0\t0\nCapEff:\t000001ffffffffff\n", True, "no readable Uid"),
        # CAP_SYS_NICE (23) alone missing: the admin reserve is the server's, MOVE_ALL is not.
        ("Uid:\t0\t0\t0\t0\nCapEff:\t000001ffff7fffff\n", True,
         "without CAP_SYS_NICE (CapEff 000001ffff7fffff): mbind's MPOL_MF_MOVE_ALL would be "
         "refused (EPERM); the simulation"),
        # CAP_SYS_ADMIN (21) alone missing: the admin reserve is kept back, nothing about mbind.
        ("Uid:\t0\t0\t0\t0\nCapEff:\t000001ffffdfffff\n", False,
         "without CAP_SYS_ADMIN (CapEff 000001ffffdfffff): overcommit_memory 2 keeps "
         "vm.admin_reserve_kbytes back from it"),
    ],
)  # fmt: skip
def test_credentials_are_read_per_capability(
    tmp_path: Path, status: str, root: bool, says: str
) -> None:
    where = tmp_path / "h"
    SimHost(Machine.x86_64(name="h")).render(where)
    (where / "proc/self/status").write_text(status)
    loaded, facts = load_dump(where)
    assert loaded.root is root
    texts = [str(n) for n in facts.notes if n.code.startswith("credentials-")]
    assert len(texts) == 1 and says in texts[0], texts
    assert ("mbind" in texts[0]) is ("CAP_SYS_NICE" in says)


def test_limits_round_trip_through_a_dump(tmp_path: Path) -> None:
    m = Machine.x86_64(rlimit_as="8GiB", memcg_max="4GiB", hugetlb_cgroup_max={"1GiB": "2GiB"})
    loaded, _ = round_trip(m, tmp_path)
    assert (loaded.rlimit_as, loaded.memcg_max) == (8 << 30, 4 << 30)
    assert loaded.hugetlb_cgroup_max == {1 << 30: 2 << 30}
    files = SimHost(m).files()
    assert files["/sys/fs/cgroup/memory.max"] == "4294967296\n"
    assert files["/sys/fs/cgroup/hugetlb.2MB.max"] == "max\n"
    assert files["/proc/self/limits"].splitlines()[1].split() == [
        "Max", "address", "space", "8589934592", "8589934592", "bytes",
    ]  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumpable_machines(cpus=False), st.booleans())
def test_every_field_round_trips_through_a_scenario_file(
    tmp_path_factory: pytest.TempPathFactory, m: Machine, root: bool
) -> None:
    """The [machine] table writer (explore/schedule_to_scenario.py) drops no field."""
    m.root = root
    path = tmp_path_factory.mktemp("scn") / "m.toml"
    step = {"op": "alloc", "id": "a", "size": 4096}
    write_scenario(
        path, name="n", description="d", machine=m, steps=[step], expect={"outcome": "ok"}
    )
    assert build_machine(load_scenario(path)) == m
