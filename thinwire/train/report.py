"""The comparison's table and `report.md` (plots: thinwire.train.report_plots).

Imports nothing from thinwire.train.compare: compare calls this module, never the reverse.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from thinwire.output import format_table, write_text_atomic
from thinwire.train import quality, report_plots
from thinwire.train.run_groups import by_rate

COLUMNS = ["algorithm", "lr", "time_to_target_s", "time_vs_ddp", "quality_at_budget",
           "samples_per_s", "speedup_vs_ddp", "iter_ms", "comm_share", "inter_node_mb_per_iter",
           "stop_reason", "bound_by"]


def headers(setting: dict) -> dict:
    metric, target = setting["metric"], setting["target"]
    sign = ">=" if quality.METRICS[metric].higher_is_better else "<="
    return {"time_to_target_s": f"s to {metric} {sign} {target:g}",
            "time_vs_ddp": "time x ddp", "quality_at_budget": f"{metric} at {setting['budget_s']:g} s",
            "samples_per_s": "samples/s", "speedup_vs_ddp": "samples/s x ddp",
            "iter_ms": "step ms", "comm_share": "comm share",
            "inter_node_mb_per_iter": "inter-node MB/step", "stop_reason": "stopped at",
            "bound_by": "bound by"}


def compute_base(runs: list[dict]) -> dict | None:
    """The compute-only step of this setting: the median over every run's own probe (each
    probe is the median of several steps without communication); min and max show its noise."""
    probes = [r["compute_ms_per_iter"] for r in runs
              if r.get("status") == "ok" and r.get("compute_ms_per_iter")]
    if not probes:
        return None
    return {"median_ms": statistics.median(probes), "min_ms": min(probes),
            "max_ms": max(probes), "probes": len(probes)}


def annotate(runs: list[dict]) -> list[dict]:
    """Per link rate: speed-up and time-to-target ratio against `ddp`; the communication share
    against the setting's one compute-only base (not each run's own, noisy probe)."""
    base = compute_base(runs)
    for group in by_rate(runs).values():
        ddp = next((r for r in group if r["algorithm"] == "ddp" and r.get("status") == "ok"),
                   None)
        for run in group:
            speed, ddp_speed = run.get("samples_per_s"), (ddp or {}).get("samples_per_s")
            run["speedup_vs_ddp"] = speed / ddp_speed if speed and ddp_speed else None
            mine, theirs = run.get("time_to_target_s"), (ddp or {}).get("time_to_target_s")
            run["time_vs_ddp"] = mine / theirs if mine and theirs else None
            if base is not None and run.get("iter_ms"):
                run["compute_base_ms"] = base["median_ms"]
                run["sync_ms_per_iter"] = max(run["iter_ms"] - base["median_ms"], 0.0)
                run["comm_share"] = run["sync_ms_per_iter"] / run["iter_ms"]
    return runs


def _cell(col: str, run: dict, setting: dict):
    value = run.get(col)
    if col == "bound_by":  # the fidelity verdict: a "host" run measured this machine
        fidelity = run.get("fidelity") or {}
        shown = {"host": "HOST", None: "-"}
        cell = shown.get(fidelity.get("verdict"), fidelity.get("verdict"))
        if fidelity.get("phases"):  # under a bandwidth schedule: each phase's, in order
            cell += " (" + "/".join(shown.get(p.get("verdict"), p.get("verdict"))
                                    for p in fidelity["phases"]) + ")"
        return cell
    if col == "lr":
        return f"{run['setting']['lr']:g}" if run.get("setting", {}).get("lr") else "-"
    if col == "time_to_target_s":
        if run.get("status") != "ok":
            return run.get("status")
        if value is not None:
            return f"{value:.1f}"
        return f"missed ({setting['budget_s']:g} s)" if run.get("stop_reason") == "budget" \
            else f"missed (end at step {run.get('steps')})"
    if value is None:
        return "-"
    if col == "comm_share":
        return f"{100 * value:.0f}%"
    if col == "quality_at_budget":
        text = f"{100 * value:.2f}%" if setting["metric"] == "test_accuracy" else f"{value:.3f}"
        return text + (" (stopped at target)" if run.get("stop_reason") == "target" else "")
    if col in ("time_vs_ddp", "speedup_vs_ddp"):
        return f"{value:.2f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return value


def tables(results: dict) -> list[tuple[str, str]]:
    """One (title, table) per link rate."""
    setting, out = results["setting"], []
    names = headers(setting)
    for rate, runs in by_rate(results["runs"]).items():
        ddp = next((r for r in runs if r["algorithm"] == "ddp" and r.get("comm_share")), None)
        title = f"inter-node {rate}"
        if ddp is not None:
            title += (f": ddp spends {100 * ddp['comm_share']:.0f}% of its step communicating "
                      f"({ddp['sync_ms_per_iter']:.0f} of {ddp['iter_ms']:.0f} ms)")
        rows = [{names.get(c, c): _cell(c, r, setting) for c in COLUMNS} for r in runs]
        out.append((title, format_table(rows, [names.get(c, c) for c in COLUMNS])))
    return out


def print_tables(results: dict) -> None:
    for title, table in tables(results):
        print(f"\n{title}\n{table}")


def write_all(results: dict, out: Path) -> list[str]:
    written = report_plots.plots(results, out)
    write_text_atomic(out / "report.md", markdown(results, written))
    return written


def _settings_lines(s: dict) -> list[str]:
    lines = [f"Workload `{s['workload']}`: model `{s['model']}`, {s['nodes']} nodes x "
             f"{s['ranks_per_node']} ranks, batch {s['batch_size']} per rank, "
             f"{'shaped' if s['shaping'] else 'UNSHAPED (loopback)'} links. Each run trains "
             f"until {s['metric']} reaches {s['target']:g} ("
             + ("higher" if quality.METRICS[s["metric"]].higher_is_better else "lower")
             + " is better)"
             + (" (then stops)" if s["stop_at_target"] else "")
             + f" or {s['budget_s']:g} s of training time have passed, whichever comes first, "
             f"evaluating every {s['eval_every']} steps (evaluation is not training time); the "
             f"learning-rate schedule spans {s['epochs']} epoch(s)"
             + (f" (at most {s['max_iters']} steps)" if s["max_iters"] else "") + ".", "",
             "Settings of every run: SGD (optimizer "
             f"`{s['optimizer']}`), momentum {s['momentum']}, weight decay {s['weight_decay']}, "
             "warm-up " + (f"{s['warmup_steps']} steps" if s["warmup_steps"] is not None
                           else "5% of the schedule") + f", seed {s['seed']}, amp `{s['amp']}`; learning rate per run in the table"
             + (f" (chosen per algorithm from the grid {s['lr_grid']} x the workload's rate, "
                "on seed " f"{s['seed'] + 1}, same budget and target)" if s["tune"]
                else " (the workload's, not tuned: run with --tune for a per-method choice)")
             + ". ",
             "- `ddp`: no hook (DDP's bucketed all-reduce, fp32); `ddp-fp16`: PyTorch's "
             "`fp16_compress_hook`;",
             f"- `powersgd`: PyTorch's `powerSGD_hook`, rank {s['powersgd_rank']}, "
             f"start_powerSGD_iter={s['powersgd_start_iter']}, warm start on, error feedback on;",
             f"- thinwire's sparse methods (`topk_allgather`, `hitopk`): density {s['density']},"
             f" selector `{s['selector']}`, dense warm-up steps {s['dense_warmup_steps']}, "
             f"density warm-up {s.get('density_warmup_steps', 0)} steps from "
             f"{s.get('density_warmup_from', 0.25)}, wire `{s.get('wire', 'none')}`, selected "
             f"values on the wire in `{s.get('sparse_wire', 'fp32')}` (indices coded narrow), "
             f"momentum correction {'on' if s['momentum_correction'] else 'off'}; "
             f"`allreduce`/`hier_allreduce`: thinwire's dense fp32 all-reduce (flat/hierarchical)."]
    return lines


def markdown(results: dict, figures: list[str] | None = None) -> str:
    s = results["setting"]
    lines = ["# thinwire compare", ""] + _settings_lines(s) + [""]
    base = compute_base(results["runs"])
    lines += ["Time to target is the training time of the first evaluation at or past the "
              "target (late by at most one evaluation interval: `time_to_target_resolution_s` "
              "in results.json); a run that never gets there is a miss. samples/s and step ms "
              "cover whole steps after the first two. inter-node MB/step = bytes each node sent "
              "over its link per step (interface counters when shaped, thinwire's traffic "
              "model otherwise)."]
    if base is not None:
        lines += ["", f"comm share = (step - compute-only step) / step, with one compute-only "
                      f"step for the whole setting: the median of the {base['probes']} runs' "
                      f"probes, {base['median_ms']:.1f} ms (they ranged {base['min_ms']:.1f}-"
                      f"{base['max_ms']:.1f} ms: one run's probe alone is that noisy on a "
                      f"shared CPU, so shares within ~"
                      f"{_noise_points(base, results['runs'])} points of each other do not "
                      f"differ)."]
    lines.append("")
    for title, table in tables(results):
        lines += [f"## {title}", "", "```", table, "```", ""]
    for name in figures or []:
        lines += [f"![{name[:-4].replace('_', ' ')}]({name})", ""]
    if results.get("tuning"):
        lines += ["## Learning-rate tuning (seed %d; DiLoCo: its outer learning rate)"
                  % (s["seed"] + 1), ""]
        for t in results["tuning"]:
            trials = ", ".join(
                f"{x['lr']:g}: " + (f"{x['time_to_target_s']:.1f} s" if x["time_to_target_s"]
                                    else f"missed, {x['quality_at_budget']}")
                for x in t["trials"])
            lines.append(f"- {t['algorithm']}: {trials} -> {t.get('setting', 'lr')} "
                         f"{t['chosen_lr']:g}")
        lines.append("")
    for run in results["runs"]:
        if run.get("status") != "ok":
            lines.append(f"- {run['algorithm']} @ {run['inter_node_bandwidth']}: "
                         f"{run['status']}, see {run.get('log')}")
    return "\n".join(lines) + "\n"


def _noise_points(base: dict, runs: list[dict]) -> str:
    steps = [r["iter_ms"] for r in runs if r.get("iter_ms")]
    if not steps:
        return "?"
    return f"{100 * (base['max_ms'] - base['min_ms']) / statistics.median(steps):.0f}"
