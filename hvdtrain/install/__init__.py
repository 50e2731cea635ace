"""Horovod in this interpreter and what ships beside the code: Horovod's build against this
TensorFlow (``hvdtrain setup horovod``), ``hvdtrain doctor`` and its report, and where the launch
scripts, patches and docs are (``shipped.py``)."""
