"""The models: the registry of built-in models and users' own (``registry.py``), with the
optimizer, loss and metric they train with, and Keras 3's BatchNormalization on TensorFlow's
fused kernel (``fused_norm.py``)."""
