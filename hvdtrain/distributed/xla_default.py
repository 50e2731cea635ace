"""Keras 3 compiles the train step with XLA by default where it sees a GPU (``compile``'s
``jit_compile="auto"``), and Horovod's all-reduce has no XLA lowering. Horovod's scripts leave
``jit_compile`` at that default: here "auto" means XLA off in a job of more than one rank,
said once on rank 0. An explicit ``jit_compile=True`` stays what the user asked for, and the
broadcast callback refuses it (``broadcast.py``).
"""
from __future__ import annotations

import sys
from typing import Any, Callable


def auto_jit_compile(keras_choice: bool, said: list[bool], chief: bool) -> bool:
    """What "auto" becomes: False, whatever Keras would choose (``keras_choice``); the first
    time Keras would have chosen XLA, rank 0 (``chief``) says so (``said`` remembers)."""
    if keras_choice and not said:
        said.append(True)
        if chief:
            print("hvdtrain: jit_compile left at Keras' default: the train step runs without "
                  "XLA, which Horovod's all-reduce cannot run under (jit_compile=False "
                  "says the same without this line)", file=sys.stderr, flush=True)
    return False


def leave_xla_off_by_default(trainer: Any = None, chief: bool | None = None) -> None:
    """Makes every Keras 3 model resolve ``jit_compile="auto"`` to False from now on."""
    if trainer is None:
        from keras.src.trainers import trainer as keras_trainer  # type: ignore[import-untyped]
        trainer = keras_trainer.Trainer
    if getattr(trainer, "hvdtrain_auto_jit", False):
        return
    if chief is None:
        # Horovod: rank 0 speaks for the job.
        import horovod.tensorflow as hvd
        chief = hvd.rank() == 0
    resolve: Callable[[Any], bool] = trainer._resolve_auto_jit_compile
    said: list[bool] = []

    def resolve_auto_jit_compile(model: Any) -> bool:
        return auto_jit_compile(bool(resolve(model)), said, bool(chief))

    trainer._resolve_auto_jit_compile = resolve_auto_jit_compile
    trainer.hvdtrain_auto_jit = True
