"""umbp-sim's emulation of sglang 0.5.23's UMBPHostTensorAllocator against the real module.

Run by ``tox -e sglang``, which installs the sglang wheel without its dependencies (only
``mem_cache/storage/umbp/umbp_host_allocator.py`` is loaded, by path). Every bundled sglang
scenario and generated requests run twice, ``--sglang installed`` and ``--sglang 0.5.23``, under
both allocator profiles: same outcome, backing, error and sglang log lines.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from umbp_sim.machine import Machine
from umbp_sim.scenario.bundled import bundled_scenarios_dir
from umbp_sim.scenario.scenario_run import observe
from umbp_sim.scenario.schema import find_scenarios, load_scenario
from umbp_sim.sglang.release import (
    EMULATED,
    MODULE_NAME,
    default_sglang_release,
    installed_version,
    load_installed_module,
)

SGLANG = [s for s in map(load_scenario, find_scenarios([bundled_scenarios_dir()]))
          if s.request_kind == "sglang"]  # fmt: skip
PROFILES = ("mori-624002c", "umbp-sim")


def test_the_installed_sglang_is_the_emulated_release():
    assert installed_version() in EMULATED
    assert default_sglang_release() == "installed"
    module = load_installed_module()
    assert module.__name__ == MODULE_NAME
    assert hasattr(module, "UMBPHostTensorAllocator")


def _facts(obs):
    sglang_lines = [m for name, _, m in obs.log if name.startswith("sglang.")]
    return (obs.outcome, obs.actual_backing, obs.mapped_size, obs.error, obs.signal,
            sglang_lines, obs.allocator_warnings)  # fmt: skip


def _both(scn, machine, profile):
    real = observe(dataclasses.replace(scn, sglang="installed", allocator=profile), machine)
    ours = observe(dataclasses.replace(scn, sglang=EMULATED[-1], allocator=profile), machine)
    return _facts(real), _facts(ours)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("scn", SGLANG, ids=lambda s: s.name)
def test_bundled_sglang_scenarios_same_with_the_real_module(scn, profile):
    from umbp_sim.scenario.scenario_run import build_machine

    real, ours = _both(scn, build_machine(scn), profile)
    assert real == ours


def test_the_real_module_logs_under_its_own_name(caplog):
    caplog.set_level(logging.INFO, logger=MODULE_NAME)
    scn = next(s for s in SGLANG if s.name == "report1-without-pool-demoted")
    from umbp_sim.scenario.scenario_run import build_machine

    observe(dataclasses.replace(scn, sglang="installed"), build_machine(scn))
    assert any(r.name == MODULE_NAME and "demoted" in r.getMessage() for r in caplog.records)


BASE = next(s for s in SGLANG if s.name == "worked-example-100gb")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    hugepage=st.sampled_from([None, "1", "0", "on", "enabled", ""]),
    size=st.sampled_from([None, "2097152", "1073741824", "4096", "1", ""]),
    node=st.sampled_from([None, "-1", "0", "1", "3"]),
    prefault=st.sampled_from([None, "0", "1"]),
    standalone=st.sampled_from([None, "", "10.0.0.1:5000"]),
    pages=st.sampled_from([0, 64, 20000, 60000]),
    nodes=st.integers(1, 2),
    hicache_gb=st.sampled_from([1, 8, 100]),
    profile=st.sampled_from(PROFILES),
)
def test_generated_requests_same_with_the_real_module(
    hugepage, size, node, prefault, standalone, pages, nodes, hicache_gb, profile
):
    env = {k: v for k, v in {
        "SGLANG_HICACHE_HOST_HUGEPAGE": hugepage, "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": size,
        "SGLANG_HICACHE_HOST_NUMA_NODE": node, "SGLANG_HICACHE_HOST_PREFAULT": prefault,
        "UMBP_STANDALONE_ADDRESS": standalone,
    }.items() if v is not None}  # fmt: skip
    request = {**BASE.request, "hicache_size": hicache_gb}
    scn = dataclasses.replace(BASE, env=env, request=request)
    pools = [{"2MiB": pages}] + [{}] * (nodes - 1)
    machine = Machine.x86_64(nodes=nodes, mem_per_node="256GiB", hugepages_per_node=pools)
    real, ours = _both(scn, machine, profile)
    assert real == ours
