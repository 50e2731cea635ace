"""Starting ranks and living as one, with no Horovod imported: the launchers' table, a rank's
process life cycle (its settings, TensorFlow's import, its exit), its placement (launcher
rank, threads, GPU) and the environment set before hvd.init()."""
