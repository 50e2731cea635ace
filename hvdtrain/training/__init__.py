"""Training a model across ranks: the Trainer, the fit and custom loops, their callbacks, exact
evaluation, LR schedules, checkpoints and the run directory, the check step before training,
rank 0's report, and prediction from a trained run."""
