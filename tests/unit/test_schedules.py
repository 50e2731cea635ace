"""Learning-rate scaling and warmup, and per-rank thread placement: pure functions."""
from __future__ import annotations

import math

import pytest

from hvdtrain.training import schedules

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


@pytest.mark.parametrize("size", [1, 2, 3, 8, 64])
def test_scaling_rules(size):
    assert schedules.scaled_lr(0.1, size, "linear") == pytest.approx(0.1 * size)
    assert schedules.scaled_lr(0.1, size, "sqrt") == pytest.approx(0.1 * math.sqrt(size))
    assert schedules.scaled_lr(0.1, size, "none") == 0.1


def test_auto_scaling_is_linear_for_the_average_and_none_for_adasum():
    assert schedules.scaling_in_force("auto", "average") == "linear"
    assert schedules.scaling_in_force("auto", "adasum") == "none"
    # A rule asked for is kept, under Adasum too.
    assert schedules.scaling_in_force("sqrt", "adasum") == "sqrt"
    assert schedules.scaling_in_force("linear", "adasum") == "linear"


def test_unknown_rule_and_bad_size():
    with pytest.raises(ValueError):
        schedules.scaled_lr(0.1, 2, "cubic")
    with pytest.raises(ValueError):
        schedules.scaled_lr(0.1, 0, "linear")


def test_warmup_ramps_linearly_from_base_to_peak():
    lr = [schedules.lr_at_step(s, base_lr=0.1, peak_lr=0.4, warmup_steps=10, total_steps=100)
          for s in range(15)]
    assert lr[0] == pytest.approx(0.1)
    assert lr[5] == pytest.approx(0.25)
    assert all(b > a for a, b in zip(lr[:10], lr[1:11]))
    assert lr[10:] == [pytest.approx(0.4)] * 5


def test_no_warmup_starts_at_peak():
    assert schedules.lr_at_step(0, base_lr=0.1, peak_lr=0.4, warmup_steps=0,
                                total_steps=10) == 0.4


def test_cosine_decays_to_zero_after_warmup():
    kw = dict(base_lr=0.1, peak_lr=0.4, warmup_steps=10, total_steps=110, decay="cosine")
    assert schedules.lr_at_step(10, **kw) == pytest.approx(0.4)
    assert schedules.lr_at_step(60, **kw) == pytest.approx(0.2)
    assert schedules.lr_at_step(110, **kw) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("decay", ["constant", "cosine"])
@pytest.mark.parametrize("warmup", [0, 10])
def test_an_lr_called_final_never_changes_again(decay, warmup):
    kw = dict(base_lr=0.1, peak_lr=0.4, warmup_steps=warmup, total_steps=100, decay=decay)
    final = [s for s in range(120) if schedules.lr_is_final(s, warmup_steps=warmup, decay=decay)]
    for step in final:
        assert schedules.lr_at_step(step, **kw) == schedules.lr_at_step(step + 37, **kw)
    # Not final: the warmup's steps and every cosine step, which the lr changes after.
    assert final == (list(range(warmup, 120)) if decay == "constant" else [])
