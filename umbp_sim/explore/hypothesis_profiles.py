"""Hypothesis profiles of the exploration tests, chosen by the HYPOTHESIS_PROFILE env var.

``ci`` (the default): the whole exploration (strategies, stateful model, schedule writer)
well under 60 s on two cores. ``deep``: many more and longer schedules, for ``tox -e explore``.
Test modules use ``active()`` (a ``settings`` object: ``@active()`` on a test, or
``TestCase.settings = active()``), so loading our profile never changes other modules' tests.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("ci", "deep")
# No "explain" phase in CI: its line tracing makes each shrunk failure several times slower.
_CI_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register() -> None:
    settings.register_profile(
        "ci",
        max_examples=200,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        phases=_CI_PHASES,
        print_blob=True,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "deep",
        max_examples=2000,
        stateful_step_count=80,
        deadline=None,
        print_blob=True,
        suppress_health_check=_SUPPRESS,
    )


def name() -> str:
    """The active profile: HYPOTHESIS_PROFILE if it is one of ours, else ``ci``."""
    value = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return value if value in PROFILES else "ci"


def active(**overrides: object) -> settings:
    """The active profile's settings (registered on first use), with ``overrides``."""
    register()
    base = settings.get_profile(name())
    return settings(base, **overrides) if overrides else base  # type: ignore[arg-type]


def examples(ci: int, deep: int) -> int:
    """A per-test example count that follows the active profile."""
    return deep if name() == "deep" else ci
