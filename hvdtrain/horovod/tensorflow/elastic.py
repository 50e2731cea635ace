"""``horovod.tensorflow.elastic``'s API on hvdtrain."""
from hvdtrain.distributed.horovod_elastic import KerasState, TensorFlowKerasState, run

__all__ = ["run", "KerasState", "TensorFlowKerasState"]
