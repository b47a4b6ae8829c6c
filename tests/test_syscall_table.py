"""The seam's calls are declared once (``UMBP_KERNEL_CALLS`` in csrc/kernel/kernel.h): every
kernel's overrides, the SysOp enum and its names in C++, and Python's ``faults.OPS`` (through
``_native.SYSCALL_OPS``) are generated from it; what lists the operations by hand is checked
against it here: the C ABI's inline calls, the fault strategies' errno and filter tables.
(The interposer's wrapped libc symbols: tests/external/test_wrapped_symbols.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from umbp_sim import _native, faults, strategies
from umbp_sim.capi import get_include

ROOT = Path(__file__).resolve().parent.parent
DECLARATION = ROOT / "csrc" / "kernel" / "kernel.h"


def declared() -> list[str]:
    """The calls of UMBP_KERNEL_CALLS but page_size (neither traced nor faulted), in order."""
    text = DECLARATION.read_text()
    body = text[text.index("#define UMBP_KERNEL_CALLS(X)") :].split("\n\n", 1)[0]
    calls = re.findall(r"\bX\(\w+, (\w+),", body)
    assert calls[0] == "page_size"
    return calls[1:]


def test_python_has_the_declared_operations_in_their_order() -> None:
    ops = declared()
    assert ops[:2] == ["mmap", "munmap"] and len(ops) == len(set(ops))
    assert list(_native.SYSCALL_OPS) == ops  # the extension was built from this declaration
    assert faults.OPS == tuple(ops)


def test_the_c_abi_has_a_call_for_each_operation_and_no_other() -> None:
    header = (Path(get_include()) / "umbp_sim" / "kernel.h").read_text()
    calls = set(re.findall(r"static inline umbp_sim_result umbp_sim_(\w+)\(", header))
    assert calls == set(faults.OPS)


def test_the_fault_strategies_draw_for_each_operation() -> None:
    assert set(strategies._ERRNOS) == set(faults.OPS)
    assert set(strategies._FILTERS) == set(faults.OPS)


def test_an_unknown_operation_names_the_declared_ones() -> None:
    try:
        faults.FaultRule(op="mremap", errno="ENOMEM")
    except faults.FaultPlanError as e:
        assert ", ".join(faults.OPS) in str(e)
    else:
        raise AssertionError("mremap was taken as an operation")
