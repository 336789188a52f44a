"""Which candidate auto takes where the steps to target vary with the seed.

A candidate's predicted time to target is its step time times its steps to target, and the
steps are measured once per workload, at one seed or several (thinwire.sim.steps). The seeds
disagree: on compare's LM, 2 x 2, hitopk at density 0.05 took 80, 105, 130 and 85 steps at
seeds 0-3, PowerSGD rank 4 took 90, 70, 95 and 75. The median says hitopk (85 against 90 at
seeds 0, 2, 3), but at two seeds of three PowerSGD was well ahead, and a run is one seed: what
the user meets is one of those outcomes, not their median.

thinwire's aim is never to lose by much, so where the table measured two seeds or more, auto
takes the candidate whose largest loss to its rivals over the seeds is least (minimax regret
over the seeds): at each seed, a candidate's time over the fastest candidate's at that seed;
its worst over the seeds; the smallest worst first, the predicted (median) time breaking ties.
The comparison is among the candidates measured at every seed of the table (a candidate seen
at fewer seeds has a risk nobody measured; those follow, by predicted time). With one seed
this is the plain ranking by predicted time.
"""

from __future__ import annotations


def worst_losses(by_seed: dict[str, dict[str, float]]) -> dict[str, float]:
    """{candidate: its largest time over the fastest candidate's at the same seed}, over the
    candidates of ``by_seed`` ({candidate: {seed: time to target}}) and their seeds."""
    seeds = {seed for times in by_seed.values() for seed in times}
    fastest = {seed: min(times[seed] for times in by_seed.values() if seed in times)
               for seed in seeds}
    return {name: max(t / fastest[seed] for seed, t in times.items())
            for name, times in by_seed.items() if times}


def order(times: dict[str, float | None], by_seed: dict[str, dict[str, float]]
          ) -> tuple[list[str], dict[str, float]]:
    """(the candidates with a predicted time, in the order auto takes them; each compared
    candidate's worst loss over the seeds, empty where fewer than two seeds were measured).
    ``times``: {candidate: predicted time to target, None: not ranked}; ``by_seed``:
    {candidate: {seed: time to target at that seed's steps}}."""
    ranked = sorted((t, name) for name, t in times.items() if t is not None)
    seeds = {seed for name in times if times[name] is not None
             for seed in by_seed.get(name, {})}
    if len(seeds) < 2:
        return [name for _, name in ranked], {}
    full = {name: by_seed[name] for _, name in ranked
            if set(by_seed.get(name, {})) == seeds}
    losses = worst_losses(full)
    compared = sorted(full, key=lambda name: (losses[name], times[name]))
    return compared + [name for _, name in ranked if name not in full], losses


__all__ = ["order", "worst_losses"]
