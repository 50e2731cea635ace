"""bench peers' arithmetic: rates and time to accuracy, what runs on which stack, the verdicts."""
from __future__ import annotations

import pytest

from hvdtrain.bench import peers

def test_epoch_rates_and_the_time_to_accuracy():
    assert peers.epoch_rates([1.0, 2.0, 2.5], 100) == [100.0, 200.0]
    assert peers.time_to_accuracy([1.0, 2.0, 3.0], [0.9, 0.96, 0.97]) == 2.0
    assert peers.time_to_accuracy([1.0], [0.5]) is None


def test_peers_run_what_this_stack_cannot_in_the_other_venv(monkeypatch):
    stacks = {"k3": {"keras": "3.15.1"}, "k2": {"keras": "2.15.0"}}
    monkeypatch.setattr(peers.host, "stack_versions", lambda python: stacks[python])
    plan = peers.plan_systems("k3", "k2")
    assert plan["mwms"]["python"] == "k2" and plan["ps"]["python"] == "k2"
    assert plan["mwms"]["other_stack_because"] == peers.UNAVAILABLE_ON_KERAS3["mwms"]
    assert plan["hvdtrain"] == {"python": "k3"} and plan["hvdtrain-gloo"] == {"python": "k3"}
    # Control: without another venv they are marked, not run.
    assert "unavailable" in peers.plan_systems("k3", None)["mwms"]
    assert peers.plan_systems("k2", None)["mwms"] == {"python": "k2"}
    # Ratios pair the systems' runs round by round.
    runs = {"hvdtrain": [{"samples_per_sec": 100.0}, {"samples_per_sec": 50.0}],
            "hvdtrain-gloo": [{"samples_per_sec": 90.0}, {"samples_per_sec": 48.0}]}
    ratio = peers.per_round_ratio(runs, "hvdtrain-gloo", "hvdtrain")
    assert ratio["per_round"] == pytest.approx([0.9, 0.96])
    assert peers.per_round_ratio(runs, "hvdtrain", "mwms") is None


def test_time_to_95_verdicts_are_per_round_ratios_with_their_spread():
    def rows(ours: list, single: list) -> dict:
        return {"results": [
            {"system": "hvdtrain", "rounds": [{"seconds_to_95": s} for s in ours]},
            {"system": "single", "rounds": [{"seconds_to_95": s} for s in single]},
            {"system": "mwms", "unavailable": "keras#20585"}]}
    faster, mwms = peers.time_verdicts(rows([1.0, 1.1, 0.9], [2.0, 2.2, 1.8]))
    assert faster.endswith("(3 of 3 rounds): 0.5000 (spread 0.0%): meets <= 1"), faster
    assert mwms == "hvdtrain against mwms: mwms not run"
    # Controls: slower in every round misses; rounds that disagree are noise, whatever the
    # median; a round where one side never reached 95% is left out, and said so.
    assert peers.time_verdicts(rows([2.0, 2.0], [1.0, 1.0]))[0].endswith("misses <= 1")
    noisy = peers.time_verdicts(rows([1.0, 1.0, 1.0], [2.0, 1.2, 0.8]))[0]
    assert noisy.endswith("noise: does not count"), noisy
    assert "(1 of 2 rounds)" in peers.time_verdicts(rows([1.0, None], [2.0, 2.0]))[0]
