# ruff: noqa: E501  (the CASES table keeps each malformed file and its error on one line)
"""Scenario files that are malformed: each is one line naming the file and the key.

Every case starts from a valid file and breaks one thing, so the error can only come from that
thing. The library itself must load cleanly and follow its conventions.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from umbp_sim.scenario.schema import ScenarioError, find_scenarios, load_scenario

LIBRARY = Path(__file__).resolve().parent.parent / "scenarios"

SCENARIO = '[scenario]\nname = "s"\ndescription = "d"\nsource = "t"\n'
MACHINE = '[machine]\nnodes = 1\nmem_per_node = "16GiB"\n'
REQUEST = '[request]\nsize = "2MiB"\nbacking = "AnonymousHugetlb"\n'
EXPECT = '[expect]\noutcome = "demoted"\n'


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def valid(**parts: str) -> str:
    """A valid file with some of its tables replaced (a value of "" drops the table)."""
    tables = {"scenario": SCENARIO, "machine": MACHINE, "request": REQUEST, "expect": EXPECT}
    extra = parts.pop("extra", "")
    tables.update(parts)
    return extra + "".join(tables.values())


def load_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    assert ei.value.exit_code == 65
    return msg.removeprefix(f"{path}: ")


def test_the_valid_base_loads(tmp_path: Path) -> None:
    scn = load_scenario(write(tmp_path, valid()))
    assert (scn.name, scn.description, scn.source) == ("s", "d", "t")
    assert scn.request_kind == "alloc"
    assert scn.request == {"size": "2MiB", "backing": "AnonymousHugetlb"}
    assert scn.expect == {"outcome": "demoted"}
    assert (scn.faults, scn.env, scn.fault_seed, scn.tags) == ([], {}, 0, [])
    assert scn.label == "s.toml: s"


# (what is broken, the file, the error after "<file>: ")
CASES = [
    # the document
    ("invalid toml", "[scenario\nname = 1\n", r"^invalid TOML: "),
    ("unknown top-level key", valid(extra='colour = "red"\n'), r"^colour: unknown key \(allowed: env, expect, fault_seed, faults, machine, request, scenario, umbp_sim_scenario\)$"),
    ("unknown table", valid(extra="[machines]\nnodes = 2\n"), r"^machines: unknown key"),
    ("no [scenario]", valid(scenario=""), r"^\[scenario\]: missing table$"),
    ("no [machine]", valid(machine=""), r"^\[machine\]: missing table$"),
    ("no [request]", valid(request=""), r"^\[request\]: missing table$"),
    ("no [expect]", valid(expect=""), r"^\[expect\]: missing table$"),
    ("[machine] not a table", 'machine = 3\n' + valid(machine=""), r"^\[machine\]: expected a table, got an integer \(3\)$"),
    # [scenario]
    ("unknown [scenario] key", valid(scenario=SCENARIO + 'owner = "me"\n'), r"^\[scenario\]\.owner: unknown key \(allowed: allocator, description, name, sglang, source, tags\)$"),
    ("name not a string", valid(scenario='[scenario]\nname = 3\ndescription = "d"\n'), r"^\[scenario\]\.name: expected a string, got an integer \(3\)$"),
    ("no description", valid(scenario='[scenario]\nname = "s"\n'), r"^\[scenario\]\.description: missing$"),
    ("source not a string", valid(scenario=SCENARIO.replace('source = "t"', "source = 1")), r"^\[scenario\]\.source: expected a string, got an integer \(1\)$"),
    ("tags not strings", valid(scenario=SCENARIO + "tags = [1]\n"), r"^\[scenario\]\.tags\[0\]: expected a string, got an integer \(1\)$"),
    # fault_seed, [[faults]]
    ("negative fault_seed", valid(extra="fault_seed = -1\n"), r"^fault_seed: must be at least 0, got -1$"),
    ("boolean fault_seed", valid(extra="fault_seed = true\n"), r"^fault_seed: expected an integer, got a boolean \(True\)$"),
    ("faults not tables", valid(extra="faults = [1, 2]\n"), r"^\[\[faults\]\]\[0\]: expected a table, got an integer \(1\)$"),
    ("unknown errno", valid(extra='[[faults]]\nop = "mmap"\nerrno = "ENOPE"\n'), r"^faults\[0\]\.errno: unknown errno 'ENOPE'"),
    ("unknown fault op", valid(extra='[[faults]]\nop = "mmap2"\nerrno = "ENOMEM"\n'), r"^faults\[0\]\.op: "),
    ("unknown fault key", valid(extra='[[faults]]\nop = "mmap"\nerrno = "ENOMEM"\nwhen = 3\n'), r"^faults\[0\]\.when: "),
    ("two schedules", valid(extra='[[faults]]\nop = "mmap"\nerrno = "ENOMEM"\nnth = 1\nevery = 2\n'), r"^faults\[0\]\.every: use only one of nth, calls, every, first$"),
    ("second rule bad", valid(extra='[[faults]]\nop = "mmap"\nerrno = "ENOMEM"\n[[faults]]\nop = "close"\n'), r"^faults\[1\]"),
    # [machine]
    ("unknown [machine] key", valid(machine=MACHINE + "hugepage = 3\n"), r"^\[machine\]\.hugepage: unknown key \(allowed: admin_reserve_kbytes, arch, "),
    ("dump not found", valid(machine='[machine]\ndump = "nope.tar.bz2"\n'), r"^\[machine\]\.dump: no such file: .*/nope\.tar\.bz2$"),
    ("dump not a string", valid(machine="[machine]\ndump = 3\n"), r"^\[machine\]\.dump: expected a string, got an integer \(3\)$"),
    # [env]
    ("env not sglang's", valid(extra='[env]\nPATH = "/bin"\n'), r"^\[env\]\.PATH: only SGLANG_HICACHE_HOST_\* and MORI_GLOBAL_LOG_LEVEL, MORI_UMBP_LOG_LEVEL, UMBP_STANDALONE_ADDRESS are read$"),
    ("env value not a string", valid(extra="[env]\nSGLANG_HICACHE_HOST_NUMA_NODE = 1\n"), r"^\[env\]\.SGLANG_HICACHE_HOST_NUMA_NODE: expected a string, got an integer \(1\)$"),
    # [request] kind = alloc
    ("unknown kind", valid(request='[request]\nkind = "malloc"\nsize = 1\n'), r"^\[request\]\.kind: 'malloc' is not one of alloc, steps, sglang$"),
    ("alloc without size", valid(request='[request]\nbacking = "Anonymous"\n'), r"^\[request\]\.size: missing \(an alloc request needs a size\)$"),
    ("size unreadable", valid(request='[request]\nsize = "2 parsecs"\n'), r"^\[request\]\.size: cannot read size '2 parsecs'"),
    ("size negative", valid(request="[request]\nsize = -1\n"), r"^\[request\]\.size: "),
    ("size boolean", valid(request="[request]\nsize = true\n"), r"^\[request\]\.size: "),
    ("backing unknown", valid(request='[request]\nsize = 1\nbacking = "Hugetlb"\n'), r"^\[request\]\.backing: 'Hugetlb' is not one of Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb$"),
    ("hugepage_size unreadable", valid(request='[request]\nsize = 1\nhugepage_size = "huge"\n'), r"^\[request\]\.hugepage_size: cannot read size 'huge'"),
    ("numa_node a string", valid(request='[request]\nsize = 1\nnuma_node = "1"\n'), r"^\[request\]\.numa_node: expected an integer, got a string \('1'\)$"),
    ("numa_node a boolean", valid(request="[request]\nsize = 1\nnuma_node = true\n"), r"^\[request\]\.numa_node: expected an integer, got a boolean \(True\)$"),
    ("prefault not boolean", valid(request='[request]\nsize = 1\nprefault = "yes"\n'), r"^\[request\]\.prefault: expected true or false, got a string \('yes'\)$"),
    ("unknown alloc key", valid(request="[request]\nsize = 1\nnode = 1\n"), r"^\[request\]\.node: unknown key \(allowed: backing, hugepage_size, numa_node, prefault, size\)$"),
    # [request] kind = steps
    ("steps missing", valid(request='[request]\nkind = "steps"\n'), r"^\[request\]\.steps: missing$"),
    ("steps empty", valid(request='[request]\nkind = "steps"\nsteps = []\n'), r"^\[request\]\.steps: expected an array of tables \(at least 1\)$"),
    ("step not a table", valid(request='[request]\nkind = "steps"\nsteps = ["alloc"]\n'), r"^\[request\]\.steps\[0\]: expected a table, got a string \('alloc'\)$"),
    ("step op unknown", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "malloc", id = "a" }]\n'), r"^\[request\]\.steps\[0\]\.op: 'malloc' is not one of alloc, free, acquire, release, lookup, mapped, set_nr_hugepages$"),
    ("step without op", valid(request='[request]\nkind = "steps"\nsteps = [{ id = "a" }]\n'), r"^\[request\]\.steps\[0\]\.op: None is not one of "),
    ("alloc step without size", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "alloc", id = "a" }]\n'), r"^\[request\]\.steps\[0\]\.size: missing$"),
    ("alloc step without id", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "alloc", size = 1 }]\n'), r"^\[request\]\.steps\[0\]\.id: missing$"),
    ("second step bad backing", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "alloc", id = "a", size = 1 }, { op = "alloc", id = "b", size = 1, backing = "Shm" }]\n'), r"^\[request\]\.steps\[1\]\.backing: 'Shm' is not one of "),
    ("free step unknown key", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "free", id = "a", backing = "Anonymous" }]\n'), r"^\[request\]\.steps\[0\]\.backing: unknown key \(allowed: id, offset, op, size\)$"),
    ("acquire offset unreadable", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "acquire", id = "a", offset = "far" }]\n'), r"^\[request\]\.steps\[0\]\.offset: cannot read size 'far'"),
    ("lookup size negative", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "lookup", id = "a", size = -4 }]\n'), r"^\[request\]\.steps\[0\]\.size: "),
    ("set_nr_hugepages pages", valid(request='[request]\nkind = "steps"\nsteps = [{ op = "set_nr_hugepages", pages = "8" }]\n'), r"^\[request\]\.steps\[0\]\.pages: expected an integer, got a string \('8'\)$"),
    ("steps with alloc keys", valid(request='[request]\nkind = "steps"\nsize = 1\nsteps = [{ op = "free", id = "a" }]\n'), r"^\[request\]\.size: unknown key \(allowed: steps\)$"),
    # [request] kind = sglang
    ("sglang without layers", valid(request='[request]\nkind = "sglang"\nhicache_size = 1\n'), r"^\[request\]\.layers: missing$"),
    ("sglang bad layout", valid(request='[request]\nkind = "sglang"\nlayers = 2\nhicache_size = 1\nlayout = "rows"\n'), r"^\[request\]\.layout: 'rows' is not one of layer_first, page_first, page_first_direct, page_head, page_first_kv_split$"),
    ("sglang size and ratio", valid(request='[request]\nkind = "sglang"\nlayers = 2\nhicache_size = 1\nhicache_ratio = 2.0\n'), r"^\[request\]: give exactly one of hicache_size or hicache_ratio$"),
    ("sglang neither", valid(request='[request]\nkind = "sglang"\nlayers = 2\n'), r"^\[request\]: give exactly one of hicache_size or hicache_ratio$"),
    ("sglang unknown key", valid(request='[request]\nkind = "sglang"\nlayers = 2\nhicache_size = 1\nheads = 8\n'), r"^\[request\]\.heads: unknown key \(allowed: device_pool_tokens, dtype, "),
    # [expect]
    ("no outcome", valid(expect="[expect]\nno_leaks = true\n"), r"^\[expect\]\.outcome: missing \(one of ok, demoted, failed, crashed\)$"),
    ("bad outcome", valid(expect='[expect]\noutcome = "passed"\n'), r"^\[expect\]\.outcome: 'passed' is not one of ok, demoted, failed, crashed$"),
    ("unknown expect key", valid(expect=EXPECT + 'warning = "x"\n'), r"^\[expect\]\.warning: unknown key \(allowed: actual_backing, counters, "),
    ("bad actual_backing", valid(expect=EXPECT + 'actual_backing = "4K"\n'), r"^\[expect\]\.actual_backing: '4K' is not one of "),
    ("bad error_regex", valid(expect=EXPECT + 'error_regex = "("\n'), r"^\[expect\]\.error_regex: not a valid regex: "),
    ("error_regex not a string", valid(expect=EXPECT + "error_regex = 3\n"), r"^\[expect\]\.error_regex: expected a string, got an integer \(3\)$"),
    ("warnings a string", valid(expect=EXPECT + 'warnings = "ENOMEM"\n'), r"^\[expect\]\.warnings: expected an array of strings, got a string \('ENOMEM'\)$"),
    ("warnings not strings", valid(expect=EXPECT + "warnings = [1]\n"), r"^\[expect\]\.warnings\[0\]: expected a string, got an integer \(1\)$"),
    ("counters not a table", valid(expect=EXPECT + "counters = [1]\n"), r"^\[expect\]\.counters: expected a table of counter = integer, got an array \(\[1\]\)$"),
    ("counter a string", valid(expect=EXPECT + 'counters = { "hugepages.2MiB.free" = "0" }\n'), r"^\[expect\]\.counters\.hugepages\.2MiB\.free: expected an integer, got a string \('0'\)$"),
    ("counter a boolean", valid(expect=EXPECT + 'counters = { "hugepages.2MiB.free" = false }\n'), r"^\[expect\]\.counters\.hugepages\.2MiB\.free: expected an integer, got a boolean \(False\)$"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_file(tmp_path: Path, text: str, pattern: str) -> None:
    msg = load_error(write(tmp_path, text))
    assert re.search(pattern, msg), msg


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    assert load_error(missing) == "cannot read: No such file or directory"
    latin = tmp_path / "latin1.toml"
    latin.write_bytes(valid().replace('"d"', '"caf\xe9"').encode("latin-1"))
    assert load_error(latin) == "not UTF-8 text"
    assert load_error(tmp_path) == "cannot read: Is a directory"


def test_dump_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "host.tar.bz2").write_bytes(b"")
    (tmp_path / "field").mkdir()
    p = write(
        tmp_path, valid(machine='[machine]\ndump = "../dumps/host.tar.bz2"\n'), "field/s.toml"
    )
    dump = (tmp_path / "dumps" / "host.tar.bz2").resolve()
    assert load_scenario(p, root=tmp_path).machine == {"dump": dump}
    # collected alone, its tree is its directory: ../dumps is outside it (issue 26)
    assert f"[machine].dump: {dump} is outside the scenario tree" in load_error(p)
    # the same file elsewhere does not find it
    q = write(tmp_path, valid(machine='[machine]\ndump = "dumps/host.tar.bz3"\n'))
    assert "[machine].dump: no such file" in load_error(q)


def test_find_scenarios(tmp_path: Path) -> None:
    a = write(tmp_path, valid(), "a.toml")
    (tmp_path / "sub").mkdir()
    b = write(tmp_path, valid(), "sub/b.toml")
    (tmp_path / "notes.md").write_text("x")
    assert find_scenarios([tmp_path]) == [a, b]
    assert find_scenarios([b, tmp_path, a]) == [b, a]  # duplicates dropped, first wins
    with pytest.raises(ScenarioError, match=r"nope: no such file or directory$"):
        find_scenarios([tmp_path / "nope"])


# ---- the library --------------------------------------------------------------------------
LIBRARY_FILES = find_scenarios([LIBRARY])


def test_library_size_and_layout() -> None:
    assert len(LIBRARY_FILES) >= 30
    dirs = {p.parent.name for p in LIBRARY_FILES}
    assert {"field", "kernel", "allocator", "sglang"} <= dirs
    dumps = [p for p in LIBRARY_FILES if "dump" in load_scenario(p, root=LIBRARY).machine]
    assert len(dumps) >= 5
    assert all(p.name.startswith("dump-") for p in dumps)


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=[p.stem for p in LIBRARY_FILES])
def test_library_file_conventions(path: Path) -> None:
    scn = load_scenario(path, root=LIBRARY)
    assert scn.name == path.stem
    assert len(scn.description) > 40 and scn.source
    # an exact outcome: more than the outcome word alone
    assert set(scn.expect) - {"outcome"}, "assert more than the outcome"
    if scn.expect["outcome"] in ("ok", "demoted", "failed") and scn.request_kind != "steps":
        assert scn.expect.get("no_leaks") is True
    if scn.expect["outcome"] == "crashed":
        assert "signal" in scn.expect
        assert "no_leaks" not in scn.expect  # a dead process is not checked for leaks
    if scn.expect["outcome"] == "failed":
        assert "error" in scn.expect or "error_regex" in scn.expect
