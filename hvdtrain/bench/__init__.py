"""``hvdtrain bench NAME``: benchmarks that print and save figures.

    hvdtrain bench --help                               # every benchmark, one line each
    hvdtrain bench scaling   --out benchmarks/results   # throughput against world size
    hvdtrain bench all       --out benchmarks/results   # those in bench all; the README's tables

hvdtrain's subpackage of benchmarks: the rest of hvdtrain imports nothing from it but for the
``hvdtrain bench`` subcommand, which loads it when it runs. The benchmarks are
listed in one table, ``registry.MODULES``: one module each, which declares its name, help,
options, run function and place in ``bench all`` as ``BENCHMARK``; every one is a leaf that
imports no other benchmark, only ``shared/`` (workloads, plans, options, targets, statistics,
the jobs, the machine, the output). Each driver (run in one plain process) launches its
measured jobs itself, one launch per configuration, under mpirun or horovodrun, and writes
NAME.json, NAME.md and PNG plots. A rank side is ``python -m hvdtrain.bench.MODULE rank
OPTIONS_JSON`` (MODULE: the benchmark's, or a shared job's such as ``shared.trainer_job``).
"""
