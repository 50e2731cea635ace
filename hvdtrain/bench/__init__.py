"""``hvdtrain bench ...``: scaling benchmarks that print and save figures.

    hvdtrain bench scaling   --out benchmarks/results   # throughput against world size
    hvdtrain bench allreduce --out benchmarks/results   # bus bandwidth against message size
    hvdtrain bench peers     --out benchmarks/results   # against tf.distribute's strategies
    hvdtrain bench project   --out benchmarks/results   # ring cost model past this machine
    hvdtrain bench all       --out benchmarks/results   # all four, and the README's tables

Each driver (run in one plain process) launches its measured jobs itself, one launch per
configuration, under mpirun or horovodrun, and writes NAME.json, NAME.md and PNG plots.
The rank side of each benchmark is ``python -m hvdtrain.bench.MODULE rank OPTIONS_JSON``.
"""
