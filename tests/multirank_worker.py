"""Launched by the multi-rank tests under horovodrun or mpirun (or alone): trains through the
library API and saves what EVERY rank ends with, which the product itself never does (only
rank 0 writes)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from hvdtrain.launch import rank_process  # TensorFlow loads in main(), through rank_process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--preset", default="synthetic-mlp")
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--perturb-nonroot", action="store_true",
                        help="give ranks other than 0 different initial weights, so that only "
                             "a working broadcast from rank 0 can make the ranks agree")
    parser.add_argument("--skip-allreduce", action="store_true",
                        help="a control: the optimizer and the custom loop's tape left plain, "
                             "so the gradients are never all-reduced (what a silent no-op "
                             "wrapper would do)")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    rank_process.load_tensorflow()
    from hvdtrain.models import registry
    from hvdtrain.launch import rank_env
    from hvdtrain.training import trainer
    from hvdtrain.config import presets
    from hvdtrain.data import sources
    from hvdtrain import distributed as dist
    # The control trains apart on purpose: the consistency check, which would stop it, is off.
    checked = ["train.consistency_check=false"] if args.skip_allreduce else []
    cfg = presets.build_config(args.preset, None, [*args.assignments, *checked])
    world = dist.init(device=cfg.run.device, options=cfg.horovod)
    args.out.mkdir(parents=True, exist_ok=True)
    # hvdtrain's launch-default variables as hvd.init() found them in this rank's environment.
    (args.out / f"rank{world.rank}.env.json").write_text(json.dumps(
        {name: os.environ.get(name) for name in rank_env.RANK_ENV_DEFAULTS}))

    if args.perturb_nonroot and world.rank != 0:
        original_build = registry.build

        def perturbed_build(*a, **kw):
            model = original_build(*a, **kw)
            for v in model.weights:
                v.assign(v + 0.5 * (world.rank + 1))
            return model
        registry.build = perturbed_build

    if args.skip_allreduce:
        dist.distributed_optimizer = lambda optimizer, options=None: optimizer
        dist.distributed_tape = lambda tape, options: tape

    job = trainer.Trainer(cfg, world, resume=args.resume)
    summary = job.train()
    np.savez(args.out / f"rank{world.rank}.npz", *[w.numpy() for w in job.model.weights])
    if world.is_chief:
        # The eval accuracy recomputed here, by one process over the WHOLE eval set.
        dataset = sources.load(cfg.data, cfg.train.seed)
        if isinstance(dataset.eval, sources.Arrays):
            x, y = dataset.eval.x, dataset.eval.y
            predicted = np.argmax(job.model.predict(x, batch_size=256, verbose=0), axis=1)
            summary["whole_eval_set_accuracy"] = float(np.mean(predicted == y))
        (args.out / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
    rank_process.end_rank()
