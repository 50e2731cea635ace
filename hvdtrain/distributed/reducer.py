"""The one place gradients are reduced across ranks: the Keras 3 optimizer wrapper, the Keras 3
tape stand-in, Keras 2's DistributedOptimizer (through its ``_allreduce_grads``) and the custom
loop's accumulated gradients all call ``reduce_gradients``, as Horovod's optimizer, tape and
accumulation all call its ``_make_allreduce_grads_fn``.

Also the record of what a distributed tape returned (on either Keras), so that a distributed
optimizer refuses to reduce those gradients a second time."""
from __future__ import annotations

import math
import os
import weakref
from typing import Any, Sequence, TypeVar

import tensorflow as tf

# Horovod: plain collectives on tensors; no Keras inside.
import horovod.tensorflow as hvd

from hvdtrain.config import MB, HorovodConfig
from hvdtrain.distributed.reduction import compression, reduce_op
from hvdtrain.errors import UserError
from hvdtrain.launch import rank_env

T = TypeVar("T")
# The error of a step where a gradient is missing on some ranks only (places_check).
MISSING_ON_SOME_RANKS = ("hvdtrain: a gradient is missing on some ranks only (a layer skipped "
                         "by a Python if on the rank or on the data): run the same layers on "
                         "every rank")
# How the all-reduce of that check's places ends its name (timelines tell it from gradients).
PLACES = "_places"
# The gradients distributed tapes returned, by id (weakly: they go when the step drops them).
_REDUCED_BY_TAPE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def reduce_gradients(gradients: Sequence[tf.Tensor | tf.IndexedSlices | None],
                     options: HorovodConfig, name: str = "hvdtrain_gradients",
                     variables: Sequence[Any] | None = None
                     ) -> list[tf.Tensor | tf.IndexedSlices | None]:
    """The gradients averaged (or Adasum-combined) over ranks, in their order; None stays None.

    At world size 1 they come back untouched (no all-reduce, no fp16 rounding), except under
    elastic training, where a traced step outlives the world size. Dense gradients go through
    ONE all-reduce per dtype (negotiated once, of one flat tensor: ``_reduce_bucket``; one dtype
    in the usual case, float16 and float32 under some mixed precision), or with
    ``options.bucket_mb`` one per bucket (``buckets``): each depends on its own gradients
    only, so in a traced step the last layers' bucket starts while backprop still computes the
    first layers' gradients; sparse ones (IndexedSlices, from embeddings) are reduced each on
    its own, apart from the dense ones, unless sparse_as_dense makes them dense first. Adasum
    reduces every tensor on its own. ``name`` must be the same on every rank and differ
    between call sites.

    ``variables`` (what the gradients are for, in their order; any sequence of that length)
    keep the step sound where a gradient is missing (None) on some ranks only (a layer skipped
    by a Python ``if`` on the rank): the ranks would then cut other buckets, or all-gather a
    sparse gradient that others lack, and leave each other waiting. With them, which places
    are missing goes first, in an all-reduce of its own that needs no gradient (it runs as the
    step starts), and every other all-reduce of the step waits for it: where ranks differ, the
    step fails on every rank alike (MISSING_ON_SOME_RANKS; step_guard.py names the variable)
    before any of them, and before anything is applied."""
    out: list[Any] = list(gradients)
    if _alone():  # Horovod's own reducer skips it too
        return out
    if variables is not None:
        out = waiting_for(places_check(out, name), out)
    dense: list[int] = []
    sparse: list[int] = []
    for i, grad in enumerate(out):
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices) and options.sparse_as_dense:
            out[i] = tf.convert_to_tensor(grad)
        (sparse if isinstance(out[i], tf.IndexedSlices) else dense).append(i)
    if options.op == "adasum":
        _reduce_each(out, sparse + dense, options, name)
    else:
        _reduce_each(out, sparse, options, name)
        _reduce_grouped(out, dense, options, name)
    return out


def places_check(gradients: Sequence[Any], name: str) -> Any:
    """The check that every rank misses (None) the same ones of ``gradients``: an op that,
    where some rank misses one that others have, fails the step on every rank alike
    (MISSING_ON_SOME_RANKS); None where there is nothing to wait for (alone, or in eager mode,
    where it raised at once if it failed). Make every other collective of the step wait for it
    (``waiting_for``): one started on some ranks only would be left waiting when the step
    fails. It is an all-reduce of its own (named ``name`` + PLACES, the same on every rank)
    that needs no gradient, so a traced step runs it as it starts. Each place counts as
    missing and as present: averaged over ranks, a place missing on some and present on
    others is > 0 in both, and a rank that joined (hvd.join: it sends zeros) counts as
    neither."""
    if _alone():
        return None
    missing = [float(grad is None) for grad in gradients]
    # 0, from a stateful op: Grappler would fold an all-reduce of constants into its result
    # at a function's first call, once per trace; a rank that traced again alone (a batch of
    # another shape) would then wait there for the others.
    zero = tf.cast(tf.minimum(tf.timestamp(), 0.0), tf.float32)
    marker = tf.constant([missing, [1.0 - m for m in missing]], tf.float32) + zero
    # Horovod: every rank's places, averaged.
    seen = hvd.allreduce(marker, op=hvd.Average, name=f"{name}{PLACES}")
    split = tf.reduce_any((seen[0] > 0) & (seen[1] > 0))
    return tf.debugging.assert_equal(split, False, message=MISSING_ON_SOME_RANKS)


def waiting_for(check: Any, gradients: Sequence[Any]) -> list[Any]:
    """``gradients``, the same, computed after ``check`` (an op; None: at once)."""
    out = list(gradients)
    if check is None:
        return out
    with tf.control_dependencies([check]):
        for i, grad in enumerate(out):
            if isinstance(grad, tf.IndexedSlices):
                # Horovod names a sparse gradient's all-gathers after these tensors.
                out[i] = tf.IndexedSlices(tf.identity(grad.values, name="gradient_values"),
                                          tf.identity(grad.indices, name="gradient_indices"),
                                          grad.dense_shape)
            elif grad is not None:
                out[i] = tf.identity(grad)
    return out


def _alone() -> bool:
    """One rank, with nothing to combine with. Not under elastic training, where a step traced
    at size 1 may run after workers join."""
    # Horovod: the job's size now.
    return hvd.size() == 1 and not rank_env.is_elastic(os.environ)


def buckets_in_force(options: HorovodConfig) -> float:
    """The bucket size in MB this job's reducer uses (0: one all-reduce per step): the world's
    shape decides horovod.bucket_mb's auto (HorovodConfig.buckets_in_force), alike on every
    rank."""
    # Horovod: the ranks of the job and of this host.
    return options.buckets_in_force(hvd.size(), hvd.local_size(), rank_env.is_elastic(os.environ))


def _reduce_each(out: list[Any], positions: list[int], options: HorovodConfig,
                 name: str) -> None:
    """The gradients at ``positions`` in ``out`` reduced tensor by tensor, in place."""
    for i in positions:
        # Horovod: an IndexedSlices is all-gathered (values and indices), apart from the dense
        # gradients: 0.28.1's grouped all-reduce rebuilds it with another entry's shape. Adasum
        # goes tensor by tensor (its grouped form fails on CPU tensors in 0.28.1).
        out[i] = hvd.allreduce(out[i], op=reduce_op(options), compression=compression(options),
                               name=f"{name}_{i}")


def _reduce_grouped(out: list[Any], dense: list[int], options: HorovodConfig,
                    name: str) -> None:
    """The dense gradients at ``dense`` in ``out`` reduced in place: one all-reduce per dtype,
    or per bucket of ``options.bucket_mb`` (auto: HorovodConfig.buckets_in_force)."""
    by_dtype: dict[tf.DType, list[int]] = {}
    for i in dense:
        by_dtype.setdefault(out[i].dtype, []).append(i)
    limit = math.ceil(buckets_in_force(options) * MB)  # a bucket_mb > 0 gives at least 1 byte
    for dtype, of_dtype in sorted(by_dtype.items(), key=lambda item: item[0].name):
        base = name if len(by_dtype) == 1 else f"{name}_{dtype.name}"
        sizes = [_bytes(out[i].shape.num_elements(), dtype.size) for i in of_dtype]
        groups = buckets(sizes, limit)
        for k, bucket in enumerate(groups):
            grouped = [of_dtype[j] for j in bucket]
            # Its name is the same on every rank: the ranks match buckets by it.
            reduced = _reduce_bucket([out[i] for i in grouped], options,
                                     base if len(groups) == 1 else f"{base}_b{k}")
            for i, grad in zip(grouped, reduced):
                out[i] = grad


# TensorFlow splits a tensor along its first axis without copying where every part starts on a
# boundary of this many bytes (Eigen's alignment); in between, a part is copied. So does slicing
# a part's padding off, unless its size is a multiple of it too (most of a model's gradients).
ALIGN_BYTES = 64


def _aligned_elements(itemsize: int) -> int:
    return max(1, ALIGN_BYTES // itemsize)


def flat_layout(sizes: Sequence[int], itemsize: int) -> list[int]:
    """The elements each of gradients of ``sizes`` elements takes in the flat buffer: its own,
    padded to the next multiple of ALIGN_BYTES, so that every one starts on that boundary."""
    align = _aligned_elements(itemsize)
    return [-(-size // align) * align for size in sizes]


def _reduce_bucket(grads: list[tf.Tensor], options: HorovodConfig, name: str
                   ) -> list[tf.Tensor]:
    """One bucket of dense gradients of one dtype, reduced as ONE flat tensor: concatenated
    (each padded to an aligned start, ``flat_layout``), all-reduced, and split back without
    copies. Horovod's grouped all-reduce of the same gradients copies each one into its fusion
    buffer and out again, and books every tensor apart (bench phases times both). A bucket of
    one gradient, or with one of unknown size (a shape traced as None), takes the grouped
    all-reduce, and so does every bucket where ``options.flatten`` is off."""
    sizes = [grad.shape.num_elements() for grad in grads]
    if len(grads) == 1 or None in sizes or not options.flatten:
        # Horovod: one negotiation, fused into one buffer; its op takes one dtype only.
        return hvd.grouped_allreduce(grads, op=reduce_op(options),
                                     compression=compression(options), name=name)
    layout = flat_layout(sizes, grads[0].dtype.size)
    parts = []
    for grad, size, room in zip(grads, sizes, layout):
        parts.append(tf.reshape(grad, [-1]))
        if room > size:
            parts.append(tf.zeros([room - size], grad.dtype))
    # Horovod: one tensor is one entry: no copy through its fusion buffer (ring all-reduce,
    # averaged; fp16 on the wire if asked).
    flat = hvd.allreduce(tf.concat(parts, 0), op=reduce_op(options),
                         compression=compression(options), name=name)
    align = _aligned_elements(grads[0].dtype.size)
    rows = tf.split(tf.reshape(flat, [-1, align]), [room // align for room in layout])
    return [tf.reshape(tf.reshape(row, [-1])[:size], grad.shape)
            for row, size, grad in zip(rows, sizes, grads)]


def _bytes(elements: int | None, itemsize: int) -> int | None:
    return None if elements is None else elements * itemsize


def buckets(sizes: Sequence[int | None], limit: int) -> list[list[int]]:
    """The positions of gradients of ``sizes`` bytes (in variable order) in buckets of at most
    ``limit`` bytes, for one all-reduce each: taken from the last position to the first
    (backprop computes the last layers' gradients first, as PyTorch DDP's buckets), each bucket
    a run of consecutive positions, closed when the next gradient would take it past ``limit``;
    a gradient larger than ``limit`` gets a bucket of its own. ``limit`` 0: ONE bucket of all
    positions (no overlap, one negotiation per step). A size of None (a shape unknown when
    traced) counts as larger than any bucket. Within a bucket, variable order: gradients that
    all fit one bucket are laid out as at ``limit`` 0, so that they sum in the same order and
    train to the bit alike (a chaotic job diverges from one rounding apart)."""
    if limit <= 0:
        return [list(range(len(sizes)))] if sizes else []
    out: list[list[int]] = []
    held = 0
    for position in reversed(range(len(sizes))):
        size = sizes[position]
        size = limit + 1 if size is None else size
        if out and held + size <= limit:
            out[-1].insert(0, position)
            held += size
        else:
            out.append([position])
            held = size
    return out


def mark_reduced(gradients: T) -> T:
    """``gradients`` (what a distributed tape returned: a list, or one gradient), recorded as
    reduced already, and returned as they are."""
    for grad in gradients if isinstance(gradients, (list, tuple)) else [gradients]:
        if grad is not None:
            _REDUCED_BY_TAPE[id(grad)] = grad
    return gradients


class ReducingTape:
    """A GradientTape stand-in whose ``gradient`` returns the gradients reduced across ranks
    (``dist.distributed_tape``, Horovod's DistributedGradientTape through hvdtrain), on either
    Keras."""

    def __init__(self, tape: tf.GradientTape, options: HorovodConfig):
        self._tape, self._options = tape, options

    def gradient(self, target: tf.Tensor, sources: Sequence[Any]) -> list[Any]:
        flat = isinstance(sources, (list, tuple)) and all(
            hasattr(s, "shape") and hasattr(s, "dtype") for s in sources)
        return mark_reduced(reduce_gradients(self._tape.gradient(target, sources),
                                             self._options, name="hvdtrain_tape_gradients",
                                             variables=sources if flat else None))


def refuse_reduced(gradients: Sequence[Any]) -> None:
    """Raises UserError when any of ``gradients`` came from a distributed tape: a distributed
    optimizer would all-reduce them a second time (the same numbers, twice the traffic)."""
    if any(_REDUCED_BY_TAPE.get(id(g)) is g for g in gradients if g is not None):
        raise UserError("these gradients come from dist.distributed_tape and were reduced "
                        "already: apply them with a plain optimizer, not a distributed one")
