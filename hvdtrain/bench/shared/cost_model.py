"""The cost of a training step on N ranks as Horovod runs it, fed with measured figures (pure).

A step costs its compute time t_c, then the gradients' all-reduce (S bytes, fused by Horovod
into B buffers, one when they fit its fusion threshold). Each fused all-reduce pays two things:

- Horovod's fixed cost F: its background thread's cycle, the negotiation of which tensors are
  ready on every rank, and the callback that hands the result back. Paid once per fused
  all-reduce, whatever N, but for the negotiation's own messages, which grow with N:
  h(N) hops of a small message (``negotiation_hops``);
- the ring: each rank sends 2(N-1) chunks of S/N bytes, each a hop of latency a:

    T_ar(N) = B * (F + h(N) * a + 2(N-1) * a) + 2(N-1)/N * S * b
    E(N)    = t_c / (t_c + T_ar(N))                (weak-scaling efficiency, no overlap)

The terms come from their own measurements (``fit_link``, bench allreduce on 2 ranks): a from
raw MPI_Allreduce's smallest message (the ring alone, 2(N-1) = 2 hops at N = 2), F from
Horovod/MPI's smallest message less raw MPI's (and less the negotiation's hops at N = 2), b
from Horovod/MPI's best bus bandwidth at 1 MiB and above.

How the negotiation grows with N: with Horovod's response cache (on by default,
HOROVOD_CACHE_CAPACITY=1024), a tensor negotiated once is found in every rank's cache, and
each cycle the ranks agree through two all-reduces of a bit vector (a bitwise AND and an OR):
MPI's small-message all-reduce, recursive doubling, ceil(log2 N) hops each. Without it (a
capacity of 0, a tensor not yet cached, or Horovod before 0.16, as in Horovod's paper), rank 0
gathers every rank's requests (N - 1 messages into rank 0) and broadcasts the responses
(ceil(log2 N) hops).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hvdtrain.bench.shared.collectives import HOROVOD_MPI, RAW_MPI
from hvdtrain.bench.shared.targets import MIB

Negotiation = Literal["cache", "gather"]
# ASSUMED: the backward pass is 2/3 of a step (its FLOPs about twice the forward's); only it
# can hide an all-reduce (Horovod starts reducing a gradient as soon as backprop produces it).
BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class Link:
    """What one fused all-reduce costs on a network: a hop's latency, the seconds per byte,
    Horovod's fixed cost per fused all-reduce, and how its negotiation grows with N."""
    hop_s: float
    seconds_per_byte: float
    fixed_s: float = 0.0
    negotiation: Negotiation = "cache"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def negotiation_hops(ranks: int, negotiation: Negotiation) -> int:
    """The small-message hops of one cycle's negotiation on ``ranks`` ranks: two bit-vector
    all-reduces of ceil(log2 N) hops with the response cache; rank 0's gather of N - 1
    requests and the broadcast of the responses without it."""
    if ranks < 2:
        return 0
    log = math.ceil(math.log2(ranks))
    if negotiation == "cache":
        return 2 * log
    if negotiation == "gather":
        return ranks - 1 + log
    raise ValueError(f"negotiation must be 'cache' or 'gather', got {negotiation!r}")


def ring_allreduce_seconds(ranks: int, nbytes: float, hop_s: float,
                           seconds_per_byte: float) -> float:
    """The ring alone: 2(N-1)a + 2(N-1)/N * S * b (each rank sends 2(N-1) chunks of S/N)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    return 2 * (ranks - 1) * hop_s + 2 * (ranks - 1) / ranks * nbytes * seconds_per_byte


def allreduce_parts(ranks: int, nbytes: float, link: Link, buffers: int = 1
                    ) -> dict[str, float]:
    """The all-reduce of ``nbytes`` in ``buffers`` fused all-reduces on ``ranks`` ranks, by
    term: Horovod's fixed cost with the negotiation's hops, the ring's hops, the bandwidth.
    Nothing on one rank (a world of one reduces nothing)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if ranks == 1:
        return {"fixed_s": 0.0, "hops_s": 0.0, "bandwidth_s": 0.0, "total_s": 0.0}
    fixed = buffers * (link.fixed_s + negotiation_hops(ranks, link.negotiation) * link.hop_s)
    hops = buffers * ring_allreduce_seconds(ranks, 0.0, link.hop_s, 0.0)
    bandwidth = ring_allreduce_seconds(ranks, nbytes, 0.0, link.seconds_per_byte)
    return {"fixed_s": fixed, "hops_s": hops, "bandwidth_s": bandwidth,
            "total_s": fixed + hops + bandwidth}


def efficiency(compute_s: float, ranks: int, nbytes: float, link: Link) -> float:
    """Weak-scaling efficiency of a step of ``compute_s`` seconds followed by one fused
    all-reduce of ``nbytes`` over ``ranks``: compute / (compute + all-reduce)."""
    return compute_s / (compute_s + allreduce_parts(ranks, nbytes, link)["total_s"])


def step_seconds(compute_s: float, ranks: int, nbytes: float, link: Link, *,
                 overlap: float = 0.0, fusion_bytes: float | None = None,
                 backward_share: float = BACKWARD_SHARE) -> dict[str, float]:
    """One step's parts on ``ranks`` ranks: the all-reduce of ``nbytes`` in
    ceil(nbytes / fusion_bytes) fused buffers (None: one), of which ``overlap`` (0..1) of the
    backward pass's time can hide; the exposed rest adds to ``compute_s``. ``latency_s``: the
    terms a buffer pays again (Horovod's fixed cost, the negotiation, the ring's hops)."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be within 0..1, got {overlap}")
    buffers = 1 if fusion_bytes is None else max(1, math.ceil(nbytes / fusion_bytes))
    parts = allreduce_parts(ranks, nbytes, link, buffers)
    latency, bandwidth = parts["fixed_s"] + parts["hops_s"], parts["bandwidth_s"]
    hidden = min(latency + bandwidth, overlap * backward_share * compute_s)
    step = compute_s + latency + bandwidth - hidden
    return {"compute_s": compute_s, "latency_s": latency, "fixed_s": parts["fixed_s"],
            "hops_s": parts["hops_s"], "bandwidth_s": bandwidth, "hidden_s": hidden,
            "buffers": buffers, "step_s": step, "efficiency": compute_s / step}


def fit_link(allreduce_result: dict[str, Any]) -> Link:
    """This machine's link from bench allreduce's result (its world of N ranks), each term from
    its own measurement: a from raw MPI_Allreduce's smallest message over the ring's 2(N-1)
    hops; F from Horovod/MPI's time for the same message less raw MPI's and less the
    negotiation's hops (with the cache, as measured); b from Horovod/MPI's best bus bandwidth
    at 1 MiB and above. ValueError when either path is missing."""
    paths = {p["label"]: p for p in allreduce_result["paths"]}
    if HOROVOD_MPI.label not in paths or RAW_MPI.label not in paths:
        raise ValueError("the all-reduce results need the raw MPI and the Horovod/MPI paths")
    ranks = allreduce_result["ranks"]
    raw = {r["bytes"]: r["seconds"]["median"] for r in paths[RAW_MPI.label]["rows"]}
    horovod = paths[HOROVOD_MPI.label]["rows"]
    smallest = min((r for r in horovod if r["bytes"] in raw), key=lambda r: r["bytes"])
    hop = raw[smallest["bytes"]] / (2 * (ranks - 1))
    fixed = (smallest["seconds"]["median"] - raw[smallest["bytes"]]
             - negotiation_hops(ranks, "cache") * hop)
    big = [r["busbw_GBps"] for r in horovod if r["bytes"] >= MIB] or \
        [r["busbw_GBps"] for r in horovod]
    return Link(hop_s=hop, seconds_per_byte=1 / (max(big) * 1e9), fixed_s=max(fixed, 0.0))
