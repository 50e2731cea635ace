"""``horovod.tensorflow.keras.callbacks`` on hvdtrain: each brings hvdtrain's protections into
the fit that lists it (``hvdtrain/distributed/horovod_callbacks.py``)."""
from hvdtrain.distributed.horovod_callbacks import (BestModelCheckpoint,
                                                    BroadcastGlobalVariablesCallback,
                                                    LearningRateScheduleCallback,
                                                    LearningRateWarmupCallback,
                                                    MetricAverageCallback)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
