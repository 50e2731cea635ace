"""``horovod.tensorflow``'s API on hvdtrain (see ``hvdtrain.horovod``)."""
from hvdtrain.distributed.horovod_api import *  # noqa: F401,F403  (Horovod's names, as Horovod has them)
from hvdtrain.distributed.horovod_api import __all__ as _names
from hvdtrain.distributed.horovod_api import __getattr__  # noqa: F401  (the refused names)
from hvdtrain.horovod.tensorflow import elastic  # noqa: F401  (hvd.elastic.run, as in Horovod)

__all__ = [*_names, "elastic"]
