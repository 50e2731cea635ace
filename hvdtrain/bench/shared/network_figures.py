"""bench network's arithmetic and tables (pure): each link speed's figures over the interleaved
rounds, each system's efficiency against the same job on one host, and hvdtrain against
Horovod's script.

A round holds, per system, its samples/s on one host and at each link speed, and each link's
measured throughput::

    {"load_average": 1.2, "one_host": {"hvdtrain": 30.1, ...},
     "links": {"1": {"link": {"achieved_gbit_per_s": 0.96, ...}, "systems": {"hvdtrain": 28.4}}}}
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from hvdtrain.bench.shared import report, stats


# hvdtrain over Horovod's script, like for like, and hvdtrain's buckets under Gloo (where
# overlap pays on a rank's one core) against it: each ratio's key in a link's figures, its
# column in the table, and the (hvdtrain, Horovod) pair of systems it divides.
RATIOS = (("hvdtrain_over_horovod", "hvdtrain / Horovod", ("hvdtrain", "horovod")),
          ("hvdtrain_over_horovod_hvdtrain_env", "hvdtrain / Horovod with hvdtrain's launch env",
           ("hvdtrain", "horovod-hvdtrain-env")),
          ("fp16_over_horovod_fp16", "hvdtrain fp16 / Horovod fp16",
           ("hvdtrain-fp16", "horovod-fp16")),
          ("gloo_overlap_over_horovod", "hvdtrain Gloo buckets / Horovod",
           ("hvdtrain-gloo-overlap", "horovod")),
          ("gloo_overlap_over_horovod_inter_op_2",
           "hvdtrain Gloo buckets / Horovod, 2 inter-op threads",
           ("hvdtrain-gloo-overlap", "horovod-inter-op-2")),
          ("gloo_overlap_over_horovod_gloo", "hvdtrain Gloo buckets / Horovod under Gloo",
           ("hvdtrain-gloo-overlap", "horovod-gloo")))


def speed_key(gbit_per_s: float) -> str:
    """A link speed's key in a round's ``links``: '0.1', '1', '10'."""
    return f"{gbit_per_s:g}"


def link_figures(rounds: Sequence[Mapping[str, Any]], gbit_per_s: float,
                 systems: Sequence[str]) -> dict[str, Any]:
    """One link speed over the rounds: the link's achieved throughput, each system's samples/s
    and its efficiency (per round: its rate on the link over its rate on one host in the same
    round), and hvdtrain over Horovod's script like for like (RATIOS, per round), each a
    median with its spread."""
    key = speed_key(gbit_per_s)
    on_link = [r["links"][key] for r in rounds]
    figures: dict[str, Any] = {
        "gbit_per_s": gbit_per_s,
        "achieved_gbit_per_s": stats.summarize([x["link"]["achieved_gbit_per_s"]
                                                for x in on_link]),
        "systems": {}}
    if all("both_ways_gbit_per_s" in x["link"] for x in on_link):
        figures["both_ways_gbit_per_s"] = stats.summarize([x["link"]["both_ways_gbit_per_s"]
                                                           for x in on_link])
    for name in systems:
        rates = [x["systems"][name] for x in on_link]
        alone = [r["one_host"][name] for r in rounds]
        figures["systems"][name] = {
            "samples_per_sec": stats.summarize(rates),
            "efficiency": stats.ratio_summary([a / b for a, b in zip(rates, alone)])}
    for key, _, (ours, theirs) in RATIOS:
        figures[key] = (stats.ratio_summary([x["systems"][ours] / x["systems"][theirs]
                                             for x in on_link])
                        if {ours, theirs} <= set(systems) else None)
    return figures


def figures(rounds: Sequence[Mapping[str, Any]], speeds: Sequence[float],
            systems: Sequence[str]) -> dict[str, Any]:
    """Every link speed's ``link_figures``, and each system's samples/s on one host."""
    return {"one_host": {name: {"samples_per_sec": stats.summarize(
                [r["one_host"][name] for r in rounds])} for name in systems},
            "links": [link_figures(rounds, speed, systems) for speed in speeds]}


def samples_per_sec(rate: float) -> str:
    """A rate to three figures at least, trailing zeros kept: 36.0, 2.31 (ResNet-50 on a
    slow link), 2.00 (Horovod's script prints one decimal)."""
    return f"{rate:,.1f}" if rate >= 10 else f"{rate:#.3g}"


def _rate_cell(system: Mapping[str, Any]) -> str:
    rate = system["samples_per_sec"]
    text = f"{samples_per_sec(rate['median'])} (spread {rate['spread']:.1%})"
    if "efficiency" in system:
        text += f"; eff. {stats.ratio_cell(system['efficiency'])}"
    return text


def _rate(summary: Mapping[str, Any]) -> str:
    return f"{summary['median']:.3g} (spread {summary['spread']:.1%})"


def table(result: Mapping[str, Any]) -> str:
    """One row per link (and the one-host row first): the link's setting and measured
    throughput, each system's samples/s and efficiency, hvdtrain / Horovod (and each
    other ratio of RATIOS that ran)."""
    names = list(result["systems"])
    both = all("both_ways_gbit_per_s" in link for link in result["links"])
    measured = ["achieved Gbit/s, one way", "both ways at once"] if both else ["achieved Gbit/s"]
    # The first ratio's column always (empty without Horovod's script), the others where run.
    ratios = [(key, title) for i, (key, title, _) in enumerate(RATIOS)
              if i == 0 or any(link.get(key) for link in result["links"])]
    headers = ["link", *measured, *names, *(title for _, title in ratios)]
    rows = [["one host (shared memory)", *[""] * len(measured),
             *(_rate_cell(result["one_host"][n]) for n in names), *[""] * len(ratios)]]
    for link in result["links"]:
        rows.append([f"{link['gbit_per_s']:g} Gbit/s",
                     *(_rate(link[key]) for key in ("achieved_gbit_per_s",
                                                    "both_ways_gbit_per_s")[:len(measured)]),
                     *(_rate_cell(link["systems"][n]) for n in names),
                     *(stats.ratio_cell(link[key]) if link.get(key) else ""
                       for key, _ in ratios)])
    return report.markdown_table(headers, rows)


def markdown(result: Mapping[str, Any]) -> str:
    """bench network's NAME.md: what ran, the table, the systems."""
    plan, workload = result["plan"], result["workload"]
    loads = ", ".join(f"{x:.2f}" for x in result["load_average_before_each_round"])
    lines = [
        f"{workload['name']} ({'x'.join(map(str, workload['image_shape']))}, batch "
        f"{workload['batch_size_per_rank']} per rank), 2 ranks: one per namespace host, each "
        f"host one core, the hosts' link shaped by tc tbf; on one host, the same job over "
        f"shared memory. {rounds_done(result)} interleaved round(s) of {plan['repeats']} timed "
        f"repeats of {plan['steps_per_repeat']} steps after {plan['warmup_epochs']} warmup "
        f"epoch(s); samples/s: median (spread) over rounds; efficiency: per round, the rate "
        f"on the link over the same system's on one host in that round; achieved: one TCP "
        f"stream host1 to host2 for {result['probe_seconds']:g} s before each link's runs "
        f"(both ways: one stream each way at once, the slower). "
        f"Load before each round: {loads}.", "", table(result), ""]
    lines += [f"- `{name}`: {what}" for name, what in result["systems"].items()]
    lines += [f"- not run: {note}" for note in result.get("skipped", [])]
    return "\n".join(lines)


def rounds_done(result: Mapping[str, Any]) -> str:
    """'3', or '2 of 3' where the run ended before the rounds it was asked for."""
    done, asked = result["plan"]["rounds"], result.get("rounds_asked", result["plan"]["rounds"])
    return f"{done} of {asked}" if done < asked else f"{done}"


def progress_line(what: str, rate: float) -> str:
    """A run's progress line."""
    return f"  {what}: {samples_per_sec(rate)} samples/s"
