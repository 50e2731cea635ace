"""hvdtrain: data-parallel Keras training with Horovod ring all-reduce."""
__version__ = "0.2.0"
