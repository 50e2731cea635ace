"""The consistency check's cadence (distributed/check_cadence.py) on a made-up clock: the full
comparison at the first epoch's end, then once its cost and the epoch starts' are at most their
share of the training since, at every epoch's end once epochs are long; with a control each.
The check across real ranks at the epochs it passes over: the guarantees job's
control_divergence_late case."""
from __future__ import annotations

import pytest

import math

from hvdtrain.distributed.check_cadence import Cadence, epochs_between

pytestmark = pytest.mark.one_stack   # plain arithmetic


def compared_epochs(epoch_seconds: float, check_seconds: float, epochs: int,
                    start_seconds: float = 0.0, share: float = 0.004) -> list[int]:
    """The epochs (from 0) whose end a cadence of ``share`` compares, on a clock that steps by
    each epoch's start (``start_seconds`` of check), the epoch and each comparison."""
    cadence, now, compared = Cadence(share=share), 0.0, []
    for epoch in range(epochs):
        due = cadence.due(now)
        cadence.started(start_seconds)
        now += start_seconds
        began, now = now, now + epoch_seconds
        cadence.epoch_ended(now - began)
        if due:
            cadence.checked(now, now + check_seconds)
            now += check_seconds
            compared.append(epoch)
    return compared


def test_short_epochs_are_compared_every_few_and_the_comparison_stays_within_its_share():
    # A 39 ms comparison against 1 s epochs: under 0.4% of 10 epochs, more than of 9.
    assert epochs_between(0.039, 1.0, share=0.004) == 10
    compared = compared_epochs(1.0, 0.039, 31)
    assert compared == [0, 10, 20, 30]
    assert (len(compared) - 1) * 0.039 <= 0.004 * 31 * 1.0   # the first one on top
    # Control: a comparison twice as dear is made half as often.
    assert compared_epochs(1.0, 0.078, 31) == [0, 20]


def test_the_epoch_starts_count_against_the_share():
    # Each start takes 2 ms of the 4 ms an epoch may cost: the 39 ms comparison every 19.
    assert epochs_between(0.039, 1.0, 0.002, share=0.004) == 19
    assert compared_epochs(1.0, 0.039, 41, start_seconds=0.002) == [0, 19, 38]
    # Control: starts that take more than the share leave the comparison to the end.
    assert epochs_between(0.039, 1.0, 0.005, share=0.004) == math.inf
    assert compared_epochs(1.0, 0.039, 41, start_seconds=0.005) == [0]


def test_long_epochs_are_compared_at_every_end():
    assert epochs_between(0.04, 60.0, share=0.004) == 1
    assert compared_epochs(60.0, 0.04, 5) == [0, 1, 2, 3, 4]
    # Control: epochs 100 times shorter skip most ends.
    assert compared_epochs(0.6, 0.04, 5) == [0]
