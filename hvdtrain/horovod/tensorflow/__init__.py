"""``horovod.tensorflow``'s API on hvdtrain (see ``hvdtrain.horovod``)."""
import os

from hvdtrain.distributed import horovod_api as _api
from hvdtrain.distributed.horovod_api import *  # noqa: F401,F403  (Horovod's names, as Horovod has them)
from hvdtrain.distributed.horovod_api import __all__ as _names
from hvdtrain.distributed.horovod_api import __getattr__  # noqa: F401  (the refused names)
from hvdtrain.horovod.tensorflow import elastic  # noqa: F401  (hvd.elastic.run, as in Horovod)
from hvdtrain.models import fused_norm as _fused_norm

__all__ = [*_names, "elastic"]


def init(comm=None, process_sets=None) -> None:  # type: ignore[no-redef]  # noqa: F811
    """Horovod's ``init``, as hvdtrain starts a rank (``horovod_api.init``); then, on Keras 3,
    every BatchNormalization computes with TensorFlow's fused kernel, as Keras 2's did (the
    same results to float rounding; the models of Horovod's scripts normalize after every
    convolution). HVDTRAIN_FUSED_BATCH_NORM=0 keeps Keras 3's own."""
    _api.init(comm, process_sets)
    _fused_norm.fuse_every_batch_norm(os.environ.get("HVDTRAIN_FUSED_BATCH_NORM", "1") != "0")
