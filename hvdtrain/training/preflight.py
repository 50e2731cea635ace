"""The one check step before training, on every rank: the plain and the elastic path run it,
and so does a library user's ``Trainer.train()``.

All ranks stop together, with one line, on the first problem found, or none stops: a rank that
exited alone would leave the others waiting in their next collective.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

from hvdtrain.data import images, sharding
from hvdtrain import distributed as dist
from hvdtrain.config import Config, HorovodConfig, to_dict
from hvdtrain.data.sources import DataSet
from hvdtrain.errors import UserError


def world_problem(options: HorovodConfig, size: int, controller: str) -> str | None:
    """What the Horovod options cannot do with this many ranks on this controller, or None.
    (The config itself already refused what the fit loop cannot do.)"""
    if options.op != "adasum":
        return None
    if size & (size - 1):
        lower = 1 << (size.bit_length() - 1)
        return (f"horovod.op=adasum needs a power-of-two number of ranks, got {size}: "
                f"launch {lower} or {lower * 2} ranks, or use horovod.op=average")
    if controller != "mpi" and size > 1:
        return ("horovod.op=adasum needs Horovod's MPI controller (Horovod implements Adasum "
                "over MPI only): launch with mpirun or horovodrun without --gloo")
    return None


def tensorboard_problem(config: Config) -> str | None:
    """Why run.tensorboard cannot write its logs here, or None: TensorFlow's summaries need the
    tensorboard package, which TensorFlow 2.21 no longer installs."""
    if config.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        return ("run.tensorboard is on but the tensorboard package is not installed (TensorFlow "
                "2.21 no longer brings it): pip install tensorboard, or "
                "--set run.tensorboard=false")
    return None


def check(config: Config, world: dist.World, load: Callable[[], DataSet]) -> DataSet:
    """Every rank, before anything is written: the same config as rank 0's, Horovod options
    this world can run, and data that loads with at least one training sample per rank (image
    folders: a file of every class per rank, and each rank's share of the files decodable).
    Returns the loaded data set."""
    dist.check_same_config(to_dict(config), world)
    dataset = None
    problem = (world_problem(config.horovod, world.size, world.controller)
               or tensorboard_problem(config))
    if not problem:
        try:
            dataset = load()
            problem = sharding.enough_samples_problem(len(dataset.train), world.size)
            if (not problem and isinstance(dataset.train, images.ImageFiles)
                    and isinstance(dataset.eval, images.ImageFiles)):
                images.check_ready(dataset.train, dataset.eval, world.rank, world.size,
                                   config.data.verify_images)
        except UserError as e:
            problem = str(e)
    dist.agree_or_fail(problem, world)  # Horovod: all ranks stop together, or none does
    assert dataset is not None  # loaded: no rank had a problem
    return dataset
