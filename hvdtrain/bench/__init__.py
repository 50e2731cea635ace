"""``hvdtrain bench NAME``: benchmarks that print and save figures.

    hvdtrain bench --help                               # every benchmark, one line each
    hvdtrain bench scaling   --out benchmarks/results   # throughput against world size
    hvdtrain bench all       --out benchmarks/results   # all but stacks; the README's tables

The benchmarks are listed in one table, ``registry.MODULES``: one module each, which declares
its name, help, options and run function as ``BENCHMARK``. Each driver (run in one plain
process) launches its measured jobs itself, one launch per configuration, under mpirun or
horovodrun, and writes NAME.json, NAME.md and PNG plots. The rank side of each benchmark is
``python -m hvdtrain.bench.MODULE rank OPTIONS_JSON``.
"""
