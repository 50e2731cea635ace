"""Horovod's own TF2 and Keras API, served by hvdtrain on Keras 3 (TensorFlow 2.16 and later)
and on Keras 2 (TensorFlow 2.15): a Horovod script changes only its import line,

    import hvdtrain.horovod.tensorflow.keras as hvd   # for: import horovod.tensorflow.keras as hvd
    import hvdtrain.horovod.tensorflow as hvd         # for: import horovod.tensorflow as hvd

What each name does on each stack, and what is refused and why: docs/horovod-api.md.
"""
