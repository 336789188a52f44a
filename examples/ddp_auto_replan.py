"""``algorithm="auto"`` in a training script of your own: the hook is chosen from a plan when
training starts and chosen again when the link changes (``thinwire.ddp.replan``).

On the emulated cluster, with the link dropping from 1 Gbit/s to 25 Mbit/s 20 s into the job:

    thinwire cluster run --nodes 2 --ranks-per-node 2 --inter-node-bandwidth 1gbit \\
        --bandwidth-schedule 0s:1gbit,20s:25mbit -- examples/ddp_auto_replan.py \\
        --plan docs/results/plan/mnist_cal_200mbit.json --json results/ddp_auto_replan.json

The plan (``thinwire plan --json``) ranks the candidates of compare's MNIST workload at 50 Mbit/s,
200 Mbit/s and 1 Gbit/s; its model is about the size of this script's MLP (3.2 M parameters),
whose data are random: the script shows the mechanism, not a learning curve. Rank 0 prints the
first choice, every re-check (the probed goodput, kept or switched) and the seconds a step
since the one before, and writes them as JSON where ``--json`` is given.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import thinwire.ddp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="thinwire plan --json's file")
    parser.add_argument("--steps", type=int, default=240, help="training steps")
    parser.add_argument("--replan-every-s", type=float, default=10.0,
                        help="seconds between re-checks of the link (sooner where the pace "
                             "of the steps moved)")
    parser.add_argument("--pilot", type=int, default=2,
                        help="runners-up of each plan choice to measure on this script "
                             "(thinwire.ddp.replan's pilot; 0: the plan's choice as it is)")
    parser.add_argument("--fixed", default=None, metavar="CANDIDATE",
                        help="register this candidate of the plan (its name as the plan "
                             "writes it: ddp-fp16, 'hitopk d=0.05 ...') and never re-plan: the "
                             "fixed choice auto is measured against")
    parser.add_argument("--json", default=None, help="rank 0 writes its record here")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # every rank starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 784), torch.nn.ReLU(),
                                torch.nn.Linear(784, 10))
    ddp_model = DistributedDataParallel(model)
    began = time.perf_counter()  # auto's first probe counts as its time, as its checks do
    if args.fixed:
        algorithm, settings = fixed_hook(args.plan, args.fixed)
        state = thinwire.ddp.register(ddp_model, algorithm, **settings)
        state.auto = {"choice": args.fixed, "probe": None, "planned_at_bps": 0.0}
    else:
        state = thinwire.ddp.register(ddp_model, "auto", plan=args.plan)  # probes: collective
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    record = {"first_choice": state.auto["choice"], "probe": state.auto["probe"],
              "checks": [], "intervals": []}
    if not args.fixed:
        say(f"auto chose {state.auto['choice']} at {state.auto['planned_at_bps'] / 1e6:.0f} "
            f"Mbit/s nominal")
    interval_began = time.perf_counter()
    last_check = 0
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 784, generator=generator)
        y = torch.randint(0, 10, (32,), generator=generator)
        torch.nn.functional.cross_entropy(ddp_model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        now = time.perf_counter()
        algorithm = thinwire.ddp.state_of(ddp_model).algorithm
        # collective, after every step: a check where due (a one-number broadcast where not)
        event = None if args.fixed else thinwire.ddp.replan(
            ddp_model, every_s=args.replan_every_s, pilot=args.pilot)
        if event is not None:
            record["intervals"].append({"until_step": step, "at_s": now - began,
                                        "algorithm": algorithm, "steps": step - last_check,
                                        "s_per_step": (now - interval_began) /
                                        (step - last_check)})
            record["checks"].append(dict(event, at_s=time.perf_counter() - began))
            outcome = (f"switched to {event['switched_to']}" if "switched_to" in event
                       else f"kept {event['kept']}")
            goodput = event.get("goodput_Bps")
            say(f"step {step} at {now - began:.1f} s: {algorithm} took "
                f"{record['intervals'][-1]['s_per_step']:.3f} s a step; "
                + ("pilot: " if event.get("pilot") else "re-check: ")
                + (f"{goodput * 8 / 1e6:.0f} Mbit/s goodput, " if goodput else "")
                + outcome)
            interval_began, last_check = time.perf_counter(), step
    record["final_choice"] = thinwire.ddp.state_of(ddp_model).auto["choice"]
    record["train_s"] = time.perf_counter() - began
    say(f"{args.steps} steps in {record['train_s']:.1f} s, ending with {record['final_choice']}")
    if dist.get_rank() == 0 and args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        temporary = args.json + ".tmp"
        with open(temporary, "w") as handle:
            json.dump(record, handle, indent=1, default=str)
        os.replace(temporary, args.json)
    dist.destroy_process_group()


def fixed_hook(plan_path: str, name: str) -> tuple[str, dict]:
    """The hook (algorithm, settings) of the plan's candidate ``name``."""
    from thinwire import plan_choice

    try:
        return plan_choice.candidate_hook(plan_choice.load(plan_path), name)
    except ValueError as exc:
        raise SystemExit(f"--fixed: {exc} ({plan_path})") from None


def say(text: str) -> None:
    if dist.get_rank() == 0:
        print(text, flush=True)


if __name__ == "__main__":
    main()
