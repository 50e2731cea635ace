"""Horovod's API through hvdtrain outside a training pattern, after tests/horovod_api_cases.py's
cases (the guarantees' CASES, family "horovod"; docs/horovod-api.md): the collectives and
queries, each checked against the value it must give on 2 ranks; hvd.elastic.KerasState and its
callbacks in a fit; and every name hvdtrain does not serve, called as a script would.
"""
from __future__ import annotations

import numpy as np

from guarantees_patterns import fit_pattern, loss, outcome
from guarantees_registry import NONE, Context, Outcome
from horovod_api_cases import HOROVOD_OWN, horovod_callbacks, horovod_case, hvd_module, wrapped


@horovod_case("hvd_collectives", "Horovod's collectives and queries", NONE,
              """size, rank, local_size, local_rank, cross_size, cross_rank, is_initialized,
              mpi_threads_supported; allreduce (TF: tensors, Keras: values; Average, Sum),
              grouped_allreduce, allgather, broadcast, alltoall, reducescatter,
              broadcast_object, allgather_object, join, each checked against the value it
              must give on 2 ranks.""")
def hvd_collectives(ctx):
    import horovod.tensorflow as horovod_tf
    import hvdtrain.horovod.tensorflow as hvd_tf
    tf = ctx.tf
    hvd = hvd_module()
    r, n = hvd.rank(), hvd.size()
    mine = tf.constant([float(r + 1)] * 2)
    total = sum(range(1, n + 1))
    checks = {
        "size/rank/local/cross": [(n, r, hvd.local_size(), hvd.local_rank(), hvd.cross_size(),
                                   hvd.cross_rank()) == (ctx.size, ctx.rank, n, r, 1, 0), ""],
        "is_initialized": [bool(hvd.is_initialized()), ""],
        "mpi_threads_supported": [hvd.mpi_threads_supported() in (True, False), ""],
        "allreduce (TF, Average)": [np.allclose(hvd_tf.allreduce(mine).numpy(), total / n), ""],
        "allreduce (TF, Sum)": [np.allclose(hvd_tf.allreduce(mine, op=hvd.Sum).numpy(), total),
                                ""],
        "allreduce (Keras, value)": [np.allclose(hvd.allreduce([float(r + 1)]), total / n), ""],
        "grouped_allreduce": [np.allclose([t.numpy() for t in hvd_tf.grouped_allreduce(
            [mine, 2 * mine], op=hvd.Sum)], [[total] * 2, [2 * total] * 2]), ""],
        "allgather": [hvd.allgather([r]).tolist() == list(range(n)), ""],
        "broadcast": [np.allclose(hvd.broadcast([float(r)], root_rank=1), 1.0), ""],
        "alltoall": [hvd_tf.alltoall(tf.constant([r] * n)).numpy().tolist() == list(range(n)),
                     ""],
        "reducescatter": [np.allclose(hvd.reducescatter([1.0] * n, op=hvd.Sum), [n]), ""],
        "broadcast_object": [hvd.broadcast_object({"from": r}, root_rank=0) == {"from": 0}, ""],
        "allgather_object": [hvd.allgather_object(r) == list(range(n)), ""],
        "join": [hvd.join() in range(n), ""],
        "Horovod's own functions": [all(getattr(hvd, name) is getattr(horovod_tf, name)
                                        for name in HOROVOD_OWN), ", ".join(HOROVOD_OWN)],
    }
    for check in checks.values():
        check[0] = bool(check[0])
    return Outcome([np.zeros(1)], checks=checks)


@horovod_case("hvd_elastic_state", "`hvd.elastic.KerasState` and its callbacks", NONE,
              """KerasState(model, batch=0, epoch=0) with CommitStateCallback,
              UpdateBatchStateCallback and UpdateEpochStateCallback in a 2-epoch fit (outside
              horovodrun's elastic mode, which tests/multirank runs): the state must count the
              epochs, restore() must bring back the last commit and sync() rank 0's state.""")
def hvd_elastic_state(ctx):
    holder: dict = {}

    def callbacks() -> list:
        hvd = hvd_module()
        return [*horovod_callbacks()(), hvd.elastic.CommitStateCallback(holder["state"]),
                hvd.elastic.UpdateBatchStateCallback(holder["state"]),
                hvd.elastic.UpdateEpochStateCallback(holder["state"])]

    def setup(ctx: Context, role: str):
        model, opt = wrapped()(ctx, role)
        if role == "rank":
            model.compile(optimizer=opt, loss=loss(ctx.tf), jit_compile=False)
            holder["state"] = hvd_module().elastic.KerasState(model, batch=0, epoch=0)
        return model, opt

    trained = fit_pattern(ctx, setup, callbacks=callbacks, reference=False,
                          fit_kw=lambda rank: {"epochs": 2})
    state, model = holder["state"], trained.model
    counted = (state.epoch, state.batch)
    committed = model.get_weights()
    model.set_weights([w + 1.0 for w in committed])
    state.restore()
    restored = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), committed))
    if ctx.rank == 1:
        model.set_weights([w + 1.0 for w in committed])
    state.sync()
    return outcome(trained, **{
        "epoch counted": [counted == (2, 0), f"epoch, batch: {counted}"],
        "restore() = the last commit": [restored, ""]})


@horovod_case("hvd_refusals", "every refused name, called", NONE,
              """Each name of Horovod's API that hvdtrain does not serve, called as a script
              would: each must raise hvdtrain's one-line error (recorded word for word, for
              the table of names).""")
def hvd_refusals(ctx):
    from hvdtrain.distributed.horovod_api import NOT_SERVED
    from hvdtrain.errors import UserError
    hvd = hvd_module()
    checks = {}
    for name in NOT_SERVED:
        try:
            getattr(hvd, name)()
            checks[name] = [False, "no error"]
        except UserError as e:
            checks[name] = [True, str(e)]
    return Outcome([np.zeros(1)], checks=checks)


@horovod_case("hvd_refused_name", "a name Keras 3 and TF2 cannot serve", NONE,
              """hvd.broadcast_global_variables(0), TensorFlow 1's (it needs a session):
              importable, and every rank stops with one line naming what to use instead.""")
def hvd_refused_name(ctx):
    hvd_module().broadcast_global_variables(0)
    return Outcome([np.zeros(1)])
