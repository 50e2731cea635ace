"""``horovod.tensorflow.keras``'s API on hvdtrain (see ``hvdtrain.horovod``)."""
from hvdtrain.distributed.horovod_api import *  # noqa: F401,F403  (Horovod's names, as Horovod has them)
from hvdtrain.distributed.horovod_api import __all__ as _names
from hvdtrain.distributed.horovod_api import __getattr__  # noqa: F401  (the refused names)
# The Keras API's own: value-in, value-out collectives, its optimizer and load_model.
from hvdtrain.distributed.horovod_keras import (  # type: ignore[assignment]  # noqa: F401
    DistributedOptimizer, allgather, allreduce, broadcast, load_model, reducescatter)
from hvdtrain.horovod.tensorflow import init  # noqa: F401  (with the fused BatchNormalization)
from hvdtrain.horovod.tensorflow.keras import callbacks, elastic  # noqa: F401

__all__ = [*_names, "load_model", "callbacks", "elastic"]
