"""Training data, from the source a config names to each rank's tf.data pipeline. Nothing here
imports Horovod: rank and size are arguments. Importing the package imports none of its modules
(sharding and sklearn_data stay free of TensorFlow); import the one you need:

    sources         the sources (synthetic, digits, npz, tfrecord, images) -> a checked DataSet
                    -> a rank's train and eval pipelines
    sharding        which samples each rank sees: pure NumPy
    tfdata          tf.data pieces every source shares: the train stream, index-ordered
                    batches, the rank's thread budget
    records         TFRecord files: finding and checking them, the sidecar, a rank's stream
    images          image folders: scan and checks, per-class hold-out and sharding, decoding
    sklearn_data    scikit-learn's digits read from its shipped file, without importing it
    convert         ``hvdtrain data convert``: image folders or .npz -> TFRecord shards
    predict_inputs  what ``hvdtrain predict`` reads: images, .npz, TFRecord files, the eval set
"""
