"""Property (issue 15): for generated hosts and requests, the why never contradicts the outcome
(every stated cause rests on what the run recorded, every failure has a cause) and every
suggested fix re-runs to the outcome it claims."""

from __future__ import annotations

from hypothesis import HealthCheck, given, strategies as st

from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.fix_search import run_fix
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.explore import hypothesis_profiles as profiles
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.request import AllocRequest
from umbp_sim.strategies import BACKINGS, machines

SIZES = st.sampled_from([1, 4096, 2 * MiB + 1, 64 * MiB, GiB, 3 * GiB, 12 * GiB, 40 * GiB])


@st.composite
def cases(draw: st.DrawFn) -> tuple[Machine, Request]:
    m = draw(machines(max_pool_pages=st.sampled_from([8, 2048])))
    cache = draw(st.sampled_from([0, 2 * GiB, 24 * GiB]))
    if cache:
        m.apply(page_cache=cache)
    nodes = len(m.nodes)
    req = Request(
        AllocRequest(
            size=draw(SIZES),
            backing=draw(st.sampled_from(BACKINGS)),
            hugepage_size=draw(st.sampled_from(sorted(m.hugepage_sizes) or [2 * MiB])),
            numa_node=draw(st.sampled_from([-1, 0, nodes - 1, nodes, 1023])),
            prefault=draw(st.booleans()),
        )
    )
    return m, req


@profiles.active(
    max_examples=profiles.examples(25, 400),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    deadline=None,
)
@given(cases())
def test_why_agrees_with_the_outcome_and_fixes_rerun(case: tuple[Machine, Request]) -> None:
    machine, request = case
    d = diagnose(machine, None, request)
    run = d.run
    recorded = {r.rule for r in run.observed.reasons}
    for cause in d.evidence:
        # A kernel cause names only rules the simulation recorded.
        assert set(cause.rules) <= recorded, (cause, recorded)
        if cause.source == "kernel":
            assert cause.rules or any(r.text in cause.text for r in run.observed.reasons), cause
    texts = " | ".join(d.causes)
    if run.outcome == "crashed":
        # The why names the signal that killed the process, from the kernel's record.
        sig = run.observed.signal
        assert sig and any(r.signal == sig for r in run.observed.reasons)
        assert sig in texts or "SIGBUS" in texts or "SIGKILL" in texts, texts
    if not run.got_what_was_asked:
        assert any(c.source in ("kernel", "allocator", "sglang") for c in d.evidence), (
            run.observed,
            d.causes,
        )
    else:
        assert "SIGKILL" not in texts and "SIGBUS" not in texts, texts
    for fix in d.fixes + d.not_helping:
        assert fix.run is not None
        claimed = fix.outcome_after
        again = run_fix(machine, request, fix)
        assert again.summary() == claimed, (fix.commands, claimed, again.summary())
    for fix in d.fixes:
        assert fix.run is not None and fix.run.rank > run.rank, fix.commands
    if not d.fixes and not run.got_what_was_asked:
        assert d.limit, "no fix and no limit named"
