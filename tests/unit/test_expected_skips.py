"""helpers.skip_unless_optional: a root-only test (mounts, network namespaces, the multi-host
and SLURM clusters) that cannot run skips with its reason, except where the suite is expected
to run it (CI as root, or HVDTRAIN_EXPECT_ROOT_TESTS=1): there it fails."""
from __future__ import annotations

import os

import pytest

import helpers

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

CASES = [  # (CI, HVDTRAIN_EXPECT_ROOT_TESTS, euid) -> expected to run the root-only tests
    (("true", None, 0), True),
    (("1", None, 0), True),
    (("true", None, 1000), False),   # CI, not root: they cannot run, and nobody expects them
    ((None, None, 0), False),        # a developer's machine as root
    (("false", None, 0), False),
    (("0", None, 0), False),
    (("true", "0", 0), False),       # turned off
    ((None, "1", 1000), True),       # asked for anywhere
]


def where(monkeypatch, ci: str | None, asked: str | None, euid: int) -> None:
    for name, value in (("CI", ci), ("HVDTRAIN_EXPECT_ROOT_TESTS", asked)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "geteuid", lambda: euid)


@pytest.mark.parametrize("machine, expected", CASES)
def test_where_the_root_only_tests_are_expected_to_run(monkeypatch, machine, expected):
    where(monkeypatch, *machine)
    assert helpers.expects_root_tests() is expected


def outcome_of(reason: str) -> BaseException:
    """What skip_unless_optional raised: pytest's fail or skip outcome (caught, so that a
    wrong one is this test's failure, not its skip)."""
    with pytest.raises(BaseException) as raised:
        helpers.skip_unless_optional(reason)
    return raised.value


def test_where_expected_a_test_that_cannot_run_fails(monkeypatch):
    where(monkeypatch, "true", None, 0)
    outcome = outcome_of("no namespaces")
    assert isinstance(outcome, pytest.fail.Exception), repr(outcome)
    assert "expected to run here" in str(outcome) and "no namespaces" in str(outcome)


def test_control_elsewhere_it_skips_with_its_reason(monkeypatch):
    where(monkeypatch, None, None, 0)
    outcome = outcome_of("no namespaces")
    assert isinstance(outcome, pytest.skip.Exception) and str(outcome) == "no namespaces"
