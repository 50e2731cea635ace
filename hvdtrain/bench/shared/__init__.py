"""What the benchmarks build on, each concern a module; none imports a benchmark module.

    stats        medians, spreads, per-round ratios, verdicts against a target
    targets      every target and noise ceiling the figures are held to
    workloads    the models the benchmarks train (--models)
    plans        a training benchmark's plan and one job's settings
    arguments    the options several benchmarks share (--models, --rounds, --venv, --other-venv)
    interleave   interleaved rounds over stacks
    host         the machine, its load, a stack's versions
    report       progress lines, Markdown tables, NAME.json and NAME.md
    plots        PNG plots
    jobs         running a measured job (hvdtrain.testing.jobs), BenchError
    launch       a measured job's command, a rank side's command line and __main__
    steps        the step timer and its arithmetic
    trainer_job  hvdtrain's Trainer on N ranks, timed (rank side and driver)
    plain_job    plain Keras fit of the same work, no Horovod (rank side and driver)
    training_rounds  both jobs in interleaved rounds, shared by scaling, tax and stacks
    horovod_synthetic  Horovod's own TF2 synthetic benchmark against hvdtrain (bench scaling)
    collectives  the all-reduce paths and their rank side (bench allreduce)
    peer_systems tf.distribute's strategies and one process on digits (bench peers)
    cost_model   the step's cost on N ranks: Horovod's fixed cost and the ring (bench project)
    paper        the cost model against Horovod's paper (bench project)
"""
