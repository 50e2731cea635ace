"""The learning-rate schedule at 2 ranks (horovodrun --gloo, fit, on CPU): the rate scaled
with the world size and warmed up over the first epoch, as metrics.jsonl logs it and as the
weights show against a replay of the schedule computed in this process."""
from __future__ import annotations

import json

import pytest

from helpers import largest_difference
from replays import assert_same, initial_model, replay_two_ranks, train

pytestmark = [pytest.mark.multirank, pytest.mark.core]


def test_lr_scaling_and_warmup_at_two_ranks_follow_the_schedule(tmp_path):
    # horovodrun --gloo, fit, plain SGD on shuffled shards: optim.lr 0.05 per rank, scaled
    # linearly to a peak of 0.1 at 2 ranks, reached by a ramp over the first epoch's 5 steps
    # (266 samples, 133 per rank, batch 32). The README's rule, written out here on its own:
    def schedule(step: int) -> float:
        return 0.05 + (0.1 - 0.05) * step / 5 if step < 5 else 0.1
    settings = ["optim.momentum=0", "optim.lr=0.05", "optim.lr_scaling=linear",
                "optim.warmup_epochs=1", "train.epochs=2", "data.num_samples=333",
                "run.tensorboard=false", "run.export=false"]
    run_dir = tmp_path / "run"
    ranks = train("gloo", 2, tmp_path / "out", *[a for s in settings for a in ("--set", s)],
                  run_dir=run_dir)
    assert_same(ranks[0], ranks[1], atol=0)
    # metrics.jsonl: the lr of each epoch's last step (steps 4 and 9).
    logged = [json.loads(line)["lr"] for line in (run_dir / "metrics.jsonl").read_text()
              .splitlines()]
    assert logged == pytest.approx([schedule(4), schedule(9)], abs=1e-9) \
        and logged == pytest.approx([0.09, 0.1], abs=1e-9), logged

    cfg, dataset, model = initial_model("synthetic-mlp", settings)
    start = model.get_weights()
    print("2 ranks vs the replay of the schedule, largest weight difference:",
          assert_same(ranks[0], replay_two_ranks(cfg, dataset, model, lr_at=schedule),
                      atol=1e-5))
    # Sharp: without the ramp (the peak from step 0), or without the scaling (0.05 throughout),
    # the weights end elsewhere.
    for control in (lambda step: 0.1, lambda step: 0.05):
        model.set_weights(start)
        assert largest_difference(ranks[0], replay_two_ranks(cfg, dataset, model,
                                                             lr_at=control)) > 1e-3
