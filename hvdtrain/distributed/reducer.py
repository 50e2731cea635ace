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
# In the error of a traced step whose buckets found a gradient missing on some ranks only.
MISSING_ON_SOME_RANKS = "hvdtrain: a gradient is missing on some ranks only"
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

    ``variables`` (what the gradients are for, in their order) keep buckets sound where a
    gradient is missing (None) on some ranks only (a layer skipped by a Python ``if`` on the
    rank): cut from each rank's own gradients, the ranks' buckets would differ in name and leave
    each other waiting. With them a missing gradient keeps its place in its bucket as zeros,
    and one bucket a step also averages which places are missing on each rank: where ranks
    differ, the step fails on every rank alike (MISSING_ON_SOME_RANKS; step_guard.py names the
    variable) before anything is applied. So too at one all-reduce a step: where ``flatten`` is
    off its grouped all-reduce names each tensor by the group's count, and Horovod's refusal
    of a flat tensor's mismatched shapes need not reach every rank."""
    out: list[Any] = list(gradients)
    # Horovod: one rank has nothing to combine with (Horovod's own reducer skips it too). Not
    # under elastic training, where a step traced at size 1 may run after workers join.
    if hvd.size() == 1 and not rank_env.is_elastic(os.environ):
        return out
    dense: list[int] = []
    sparse: list[int] = []
    holes = None if variables is None else dict(enumerate(variables))
    for i, grad in enumerate(out):
        if grad is None:
            continue
        if holes is not None:
            del holes[i]
        if isinstance(grad, tf.IndexedSlices) and options.sparse_as_dense:
            out[i] = tf.convert_to_tensor(grad)
        (sparse if isinstance(out[i], tf.IndexedSlices) else dense).append(i)
    if options.op == "adasum":
        _reduce_each(out, sparse + dense, options, name)
    else:
        _reduce_each(out, sparse, options, name)
        averages, results = _reduce_grouped(out, dense, holes, options, name)
        if averages:
            _same_places_missing(averages, results + [out[i].values for i in sparse])
    return out


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


def _reduce_grouped(out: list[Any], dense: list[int], holes: dict[int, Any] | None,
                    options: HorovodConfig, name: str
                    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """The dense gradients at ``dense`` in ``out`` reduced in place: one all-reduce per dtype,
    or per bucket of ``options.bucket_mb`` (auto: HorovodConfig.buckets_in_force). ``holes``:
    the variables of the missing gradients by position (None: not known), each keeping its
    place (see reduce_gradients). Returns the averaged markers of the missing places (none
    where ``holes`` is None) and every result."""
    limit = math.ceil(buckets_in_force(options) * MB)  # a bucket_mb > 0 gives at least 1 byte
    # Places kept alike at every bucket size, so that gradients in one bucket sum as at 0 (ring
    # all-reduce of 3 ranks or more: the buffer's length decides which rank starts each sum).
    held = holes or {}
    slots = {i: out[i] for i in dense}
    slots.update({i: _zeros_like(v) for i, v in held.items()})
    averages: list[tf.Tensor] = []
    results: list[tf.Tensor] = []
    by_dtype: dict[tf.DType, list[int]] = {}
    for i in sorted(slots):
        by_dtype.setdefault(slots[i].dtype, []).append(i)
    for dtype, of_dtype in sorted(by_dtype.items(), key=lambda item: item[0].name):
        base = name if len(by_dtype) == 1 else f"{name}_{dtype.name}"
        sizes = [_bytes(slots[i].shape.num_elements(), dtype.size) for i in of_dtype]
        groups = buckets(sizes, limit)
        # The bucket of most gradients (flat, most likely: no copy through Horovod's fusion
        # buffer) takes the marker of every place of this dtype.
        carrier = (max(range(len(groups)), key=lambda k: len(groups[k]))
                   if holes is not None else None)
        for k, bucket in enumerate(groups):
            grouped = [of_dtype[j] for j in bucket]
            missing = None if k != carrier else tf.constant(
                [float(i in held) for i in of_dtype], dtype)
            # Its name is the same on every rank: the ranks match buckets by it.
            reduced = _reduce_bucket([slots[i] for i in grouped], options,
                                     base if len(groups) == 1 else f"{base}_b{k}", missing)
            if missing is not None:
                averages.append(reduced.pop())
            results.extend(reduced)
            for i, grad in zip(grouped, reduced):
                out[i] = None if i in held else grad
    return averages, results


def _zeros_like(variable: Any) -> tf.Tensor:
    shape = tf.TensorShape(variable.shape)
    if shape.is_fully_defined():
        return tf.zeros(shape, variable.dtype)
    return tf.zeros_like(tf.convert_to_tensor(variable))


def _same_places_missing(averages: list[tf.Tensor], results: list[tf.Tensor]) -> None:
    """Fails the step on every rank where places are missing on some ranks only: averaged over
    ranks, each place's 1 (missing) or 0 is then neither. Only once every all-reduce of the
    step (``results``) is done on this rank, so that none is left for the others to wait on
    (a bucket of only missing places, whose result nothing else uses, would not even run)."""
    # Every rank sees the same averages, so all fail together, every collective done.
    with tf.control_dependencies(results):
        split = tf.reduce_any([tf.reduce_any((a > 0) & (a < 1)) for a in averages])
        tf.debugging.assert_equal(split, False, message=MISSING_ON_SOME_RANKS)


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


def _reduce_bucket(grads: list[tf.Tensor], options: HorovodConfig, name: str,
                   marker: tf.Tensor | None = None) -> list[tf.Tensor]:
    """One bucket of dense gradients of one dtype, reduced as ONE flat tensor: concatenated
    (each padded to an aligned start, ``flat_layout``), all-reduced, and split back without
    copies. Horovod's grouped all-reduce of the same gradients copies each one into its fusion
    buffer and out again, and books every tensor apart (bench phases times both). A bucket of
    one gradient, or with one of unknown size (a shape traced as None), takes the grouped
    all-reduce, and so does every bucket where ``options.flatten`` is off. A ``marker`` goes
    with the gradients, last, its average returned after theirs."""
    sizes = [grad.shape.num_elements() for grad in grads]
    grouped = len(grads) == 1 or None in sizes or not options.flatten
    if marker is not None:
        grads, sizes = [*grads, marker], [*sizes, marker.shape.num_elements()]
    if grouped:
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
