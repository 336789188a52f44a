"""The simulator's PowerSGD model (thinwire.sim.powersgd) against PyTorch's own hook and by hand."""

import json

import procs
import pytest

from thinwire.collectives.costs import Cluster
from thinwire.sim import powersgd
from thinwire.sim.compute import TimedLayer
from thinwire.sim.network import Link, Network

# PyTorch's hook on a world of one (DDP calls hooks there too) as `thinwire compare` registers it
# (thinwire.train.grad_sync): what it counts as sent per compressed step
# (total_numel_after_compression) and the P/Q memory per bucket index.
# Not `ddp.register_comm_hook(state, powerSGD_hook)` directly: PyTorch's hook `.wait()`s on an
# all-reduce inside a `.then()` callback, which gloo runs on one of its 2 run-loop threads; with
# both models' two buckets in flight, both threads can wait on work only they could run, and the
# process hangs in backward (1 run in 3 here). grad_sync's hook finishes each bucket before the
# next, so at most one callback blocks a thread and the other runs its all-reduce (its comment
# says why; test_powersgd_hook.py checks it on 2 ranks). The counts are PyTorch's own: the hook
# inside is PyTorch's, with compare's settings.
# Each DDP model is dropped and collected before the next one and before the process group goes
# (a DDP with a Python hook freed later, by the cycle collector or at the interpreter's exit,
# can hang or abort the process: see thinwire/ddp.py's exit handler).
REFERENCE = r"""
import gc, json, sys, tempfile, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from thinwire.train import grad_sync, models
dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
for name, rank in ((a, int(b)) for a, b in (arg.split(":") for arg in sys.argv[1:])):
  model = models.build(name, 0)
  ddp = DDP(model)
  state = grad_sync.register(ddp, "powersgd", powersgd_rank=rank, powersgd_start_iter=2).state
  x = torch.randint(0, 256, (2, 64)) if name == "transformer" else torch.randn(2, 1, 28, 28)
  sent = []
  for _ in range(4):
      before = state.total_numel_after_compression
      ddp(x).float().sum().backward()
      sent.append(state.total_numel_after_compression - before)
  print(json.dumps({"sent": sent, "p": [state.p_memory_dict[i].numel() for i in sorted(state.p_memory_dict)],
                    "q": [state.q_memory_dict[i].numel() for i in sorted(state.q_memory_dict)],
                    "shapes": [list(p.shape) for p in model.parameters()]}), flush=True)
  del ddp, state, model
  gc.collect()
dist.destroy_process_group()
"""


CASES = (("widecnn", 4), ("transformer", 8))


@pytest.fixture(scope="module")
def pytorch_counts():
    # ~6 s on 2 idle cores; a hang fails in 120 s with every thread's stack
    done = procs.run_python(["-c", REFERENCE] + [f"{n}:{r}" for n, r in CASES], timeout_s=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()[-len(CASES):]
    return {case: json.loads(line) for case, line in zip(CASES, lines)}


@pytest.mark.parametrize("name,rank", CASES)
def test_plan_matches_pytorchs_hook(pytorch_counts, name, rank):
    real = pytorch_counts[(name, rank)]
    plan = powersgd.plan([tuple(s) for s in real["shapes"]], rank)
    assert real["sent"][:2] == [0, 0]  # the two dense steps before compression starts
    assert real["sent"][2:] == [sum(b.sent_elements for b in plan)] * 2
    assert [b.p_elements for b in plan] == real["p"]
    assert [b.q_elements for b in plan] == real["q"]


def test_plan_by_hand():
    # 60,336 elements (241 KB) stay under the first bucket's 1 MiB: one bucket
    plan = powersgd.plan([(6, 5), (6,), (300, 200), (300,)], rank=4)
    assert len(plan) == 1
    (b,) = plan
    # (6, 5) at r=4: (6+5)*4*2 = 88 >= 30, uncompressed; (300, 200): (500)*4*2 < 60,000
    assert b.uncompressed == 30 + 6 + 300
    assert (b.p_elements, b.q_elements) == (300 * 4, 200 * 4)
    assert b.elements == 30 + 6 + 60_000 + 300
    # the last layer (1.2 MB) crosses the first bucket's 1 MiB and closes it; a conv weight is
    # viewed as (out, in * kh * kw)
    plan = powersgd.plan([(64, 32, 5, 5), (64,), (1024, 300)], rank=2)
    assert [b.elements for b in plan] == [307_200, 51_264]
    assert plan[1].uncompressed == 64
    assert plan[1].p_elements == 64 * 2 and plan[1].q_elements == 800 * 2


def test_cost_by_hand():
    """3 ring all-reduces of a 2 x 2 cluster, each 2(W-1) = 6 steps; bytes on the NIC."""
    bucket = powersgd.PowerSGDBucket(elements=100_000, uncompressed=1_000, p_elements=2_000,
                                     q_elements=3_000)
    net = Network(Link(0.0, 1e12), Link(1e-3, 1e6))
    cost = powersgd.bucket_cost(bucket, Cluster(2, 2), net, pass_rate=1e8)
    # per node: each of its 2 ranks sends 2 (W-1)/W of the vector, half of which crosses nodes
    # (thinwire.collectives.traffic.world_allreduce); the model's own count of it:
    from thinwire.collectives import traffic
    from thinwire.collectives.costs import volumes
    inter = sum(volumes(Cluster(2, 2), traffic.world_allreduce, n, 4)[1]
                for n in (1_000, 2_000, 3_000))
    assert cost.inter_bytes == pytest.approx(inter)
    assert cost.comm_s == pytest.approx(3 * 6 * 1e-3 + inter / 1e6)
    assert cost.select_s == pytest.approx((6 * 99_000 + 2 * 5_000) / 1e8)


def test_simulate_adds_everything_up_without_overlap():
    layers = [TimedLayer("a", 100, 0.01, 0.02), TimedLayer("b", 100, 0.01, 0.02)]
    net = Network(Link(0.0, 1e12), Link(1e-3, 1e6))
    row = powersgd.simulate(layers, [(300, 200), (300,)], Cluster(2, 2), net, 4, 1e8)
    assert row["iteration_s"] == pytest.approx(0.06 + row["comm_s"] + row["selection_s"])
    assert row["buckets"] == 1 and row["inter_node_mb_per_iter"] > 0


def test_bad_input():
    with pytest.raises(ValueError, match="powersgd_rank must be an integer >= 1, got 0"):
        powersgd.plan([(3, 3)], 0)
    with pytest.raises(ValueError, match="shapes must list"):
        powersgd.plan([], 4)
    with pytest.raises(ValueError, match="pass_rate must be > 0"):
        powersgd.bucket_cost(powersgd.PowerSGDBucket(1, 1, 0, 0), Cluster(1, 1),
                             Network(Link(0, 1), Link(0, 1)), 0.0)
