"""``horovod.tensorflow.keras.elastic`` on hvdtrain."""
from hvdtrain.distributed.horovod_elastic import (CommitStateCallback, KerasState,
                                                  TensorFlowKerasState, UpdateBatchStateCallback,
                                                  UpdateEpochStateCallback, run)

__all__ = ["run", "KerasState", "TensorFlowKerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
