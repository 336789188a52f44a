"""The pieces of thinwire.ft.per_step that need no second process: the optimizer state a fresh
replica is given (it must change nothing: the first step from it equals the first step from
the optimizer's own lazy start), the start barrier, and the algorithms it refuses."""

from __future__ import annotations

import copy
import re
from datetime import timedelta

import pytest
import torch

from thinwire.ft import per_step
from thinwire.optim import LAMB, LARS


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _steps(model, optimizer, count=3, device="cpu"):
    for step in range(count):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 6, generator=g).to(device)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-2),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
    lambda p: LARS(p, lr=0.1, momentum=0.9),
    lambda p: LAMB(p, lr=1e-2),
], ids=["sgd-wd", "sgd-nesterov", "sgd-plain", "adam", "adamw-amsgrad", "lars", "lamb"])
def test_a_materialized_state_trains_exactly_as_the_lazy_one(make):
    lazy, eager = _model(), _model()
    lazy_opt, eager_opt = make(lazy.parameters()), make(eager.parameters())
    per_step.materialize_optimizer_state(eager_opt)
    before = copy.deepcopy(eager_opt.state_dict())
    per_step.materialize_optimizer_state(eager_opt)  # a second call changes nothing
    assert str(before) == str(eager_opt.state_dict())
    _steps(lazy, lazy_opt)
    _steps(eager, eager_opt)
    for a, b in zip(lazy.parameters(), eager.parameters()):
        assert torch.equal(a, b)
    # and the two now have the same form (what the healing transport compares)
    assert lazy_opt.state_dict()["state"].keys() == eager_opt.state_dict()["state"].keys()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: the GPU machine runs it (tests/gpu/on_device.sh)")
@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, capturable=True),
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
], ids=["adam-fused", "adamw-capturable", "adam-foreach", "sgd-fused"])
def test_on_the_gpu_a_materialized_state_trains_exactly_as_the_lazy_one(make):
    """The GPU's optimizer variants keep ``step`` on the device (fused, capturable) or on the
    host (foreach): the materialized state must be where their first step puts it."""
    lazy, eager = _model().cuda(), _model().cuda()
    lazy_opt, eager_opt = make(lazy.parameters()), make(eager.parameters())
    per_step.materialize_optimizer_state(eager_opt)
    _steps(lazy, lazy_opt, device="cuda")
    _steps(eager, eager_opt, device="cuda")
    for a, b in zip(lazy.parameters(), eager.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(lazy_opt.state.values(), eager_opt.state.values()):
        assert {k: (v.device, v.dtype) for k, v in a.items() if torch.is_tensor(v)} == \
            {k: (v.device, v.dtype) for k, v in b.items() if torch.is_tensor(v)}


def test_an_optimizer_without_a_known_first_step_is_refused():
    model = _model()
    with pytest.raises(ValueError, match="heals SGD, Adam, AdamW, LARS and LAMB state, got "
                                         "RMSprop"):
        per_step.materialize_optimizer_state(torch.optim.RMSprop(model.parameters()))
    # one that builds its state in its constructor already has its form
    per_step.materialize_optimizer_state(torch.optim.Adagrad(model.parameters()))
    with pytest.raises(ValueError, match="use dampening=0, got 0.5"):
        per_step.materialize_optimizer_state(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5))


@pytest.mark.parametrize("algorithm", ["oktopk", "topk_a2a", "dlcp"])
def test_the_all_to_all_algorithms_are_refused_by_name(algorithm):
    with pytest.raises(ValueError, match=f"runs allreduce, hier_allreduce, topk_allgather, "
                                         f"hitopk .*got algorithm '{algorithm}'"):
        per_step.check_algorithm(algorithm)


class _Store:
    def __init__(self, start=0):
        self.count = start

    def add(self, key, amount):
        self.count += amount
        return self.count


def test_the_start_barrier_waits_for_every_node_and_names_the_count():
    per_step.wait_for_nodes(_Store(start=2), nodes=3, timeout=timedelta(seconds=1))
    per_step.wait_for_nodes(_Store(start=5), nodes=3, timeout=timedelta(seconds=1))  # back later
    with pytest.raises(TimeoutError, match="only 2 of 3 nodes started within 0.2 s"):
        per_step.wait_for_nodes(_Store(start=1), nodes=3, timeout=timedelta(seconds=0.2))


def test_counting_a_departed_nodes_mass_needs_the_rank_to_know_its_node():
    with pytest.raises(ValueError, match="count_departed_mass needs node"):
        per_step.FaultTolerantStep(None, None, None, None, None, count_departed_mass=True)


@pytest.mark.parametrize("changes, message", [
    (dict(algorithm="oktopk"), "--fault-tolerant runs --algorithm allreduce, hier_allreduce, "
                               "topk_allgather, hitopk, got --algorithm oktopk"),
    (dict(algorithm="diloco", sync_every=10), "got --algorithm diloco"),
    (dict(checkpoint="ck"), "--checkpoint ck cannot be used with --fault-tolerant: a node "
                            "heals from a live peer"),
    (dict(amp="bf16"), "--amp bf16 cannot be used with --fault-tolerant"),
    (dict(device="cuda"), "--fault-tolerant trains on the CPU here"),
])
def test_train_refuses_what_the_fault_tolerant_run_cannot_do_by_name(changes, message):
    from thinwire.train import TrainConfig

    cfg = dict(model="mlp", algorithm="hitopk", fault_tolerant=True)
    cfg.update(changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        TrainConfig(**cfg).validate()
    TrainConfig(model="mlp", algorithm="hier_allreduce", wire="bf16",
                fault_tolerant=True).validate()  # what it runs passes


class _Quorum:
    """A Manager whose quorum holds ``nodes`` nodes, every step committing."""

    def __init__(self, nodes: int):
        self.nodes, self.committed, self.step = nodes, 0, 0

    def start_quorum(self):
        pass

    def participating_rank(self):
        return 0

    def num_participants(self):
        return self.nodes

    def current_step(self):
        return self.step

    def should_commit(self):  # torchft adds the step's nodes to batches_committed
        self.committed += self.nodes
        self.step += 1
        return True

    def batches_committed(self):
        return self.committed

    def errored(self):
        return None


class _AloneWorld:
    """A world of one rank: its sums are its own values."""

    def all_reduce_sum(self, tensor):
        pass


class _NoSync:
    algorithm = "allreduce"

    def snapshot(self):
        return "snapshot"

    def healing_state_dict(self):
        return {}

    def load_state_dict(self, saved):
        pass

    def residual_mass(self):
        return {"l1": 0.0}


def test_a_run_with_nodes_away_counts_samples_for_its_schedule_and_its_data():
    """A job of 4 nodes x 2 ranks: steps of 4, 4, 2, 2 and 4 nodes are 4 full steps; the
    schedule stands where 4 full steps put it, and the next batch of local rank 1 of the
    quorum's node 1 starts past the 16 node-batches trained. With every node there, the
    schedule steps exactly as it does once a step."""
    from types import SimpleNamespace

    from thinwire.optim.schedules import warmup_cosine

    def run(counts):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = warmup_cosine(optimizer, total_steps=10, warmup_steps=2)
        manager = _Quorum(4)
        topology = SimpleNamespace(local_rank=1, ranks_per_node=2, world_size=8, rank=1,
                                   nodes=4, world=_AloneWorld(),
                                   inter=SimpleNamespace(failed=lambda: False))
        ft = per_step.FaultTolerantStep(manager, topology, _NoSync(), model, optimizer,
                                        scheduler, job_nodes=4)
        for count in counts:
            manager.nodes = count
            ft.begin()
            ft.commit()
        return ft, optimizer.param_groups[0]["lr"]

    ft, lr = run([4, 4, 2, 2, 4])
    assert ft.progress == 4.0
    plain = _model()
    reference = torch.optim.SGD(plain.parameters(), lr=0.1)
    schedule = warmup_cosine(reference, total_steps=10, warmup_steps=2)
    for _ in range(4):
        reference.step()  # no gradients: it only counts, as the schedule expects
        schedule.step()
    assert lr == reference.param_groups[0]["lr"]
    ft.manager.nodes = 3
    ft.begin()  # this rank is local rank 1 of the quorum's node 1: rank 3 of 6
    ft.topology.rank = 3
    assert ft.sample_start(8) == (16 * 2 + 3) * 8
    _, every_node = run([4] * 6)
    for _ in range(2):
        reference.step()
        schedule.step()
    assert every_node == reference.param_groups[0]["lr"]
    with pytest.raises(ValueError, match="job_nodes must be an integer >= 1, got 0"):
        per_step.FaultTolerantStep(None, None, None, None, None, job_nodes=0)


@pytest.mark.parametrize("changes, message", [
    (dict(algorithms=["ddp"]), "--fault-tolerant: the run of ddp: --fault-tolerant runs "
                               "--algorithm allreduce, hier_allreduce, topk_allgather, hitopk"),
    (dict(budget_s=30.0), "--budget-s 30 cannot be used with --fault-tolerant"),
    (dict(tune=True), "--tune cannot be used with --fault-tolerant"),
    (dict(resources={"fault_tolerant": True, "failure_schedule": "node0@5s,restart@9s"}),
     "kills node0: a race through failures keeps node 0"),
    (dict(resources={"max_restarts": 3}), "--max-restarts 3: compare races through failures "
                                          "with --fault-tolerant"),
])
def test_compare_refuses_what_a_race_through_failures_cannot_do_by_name(changes, message):
    from thinwire.train.compare import CompareSettings, default_algorithms

    settings = {"algorithms": default_algorithms(fault_tolerant=True),
                "resources": {"fault_tolerant": True}, **changes}
    with pytest.raises(ValueError, match=re.escape(message)):
        CompareSettings(**settings).validate()
    assert default_algorithms(fault_tolerant=True) == ["allreduce", "hier_allreduce",
                                                      "topk_allgather", "hitopk"]
    CompareSettings(algorithms=["hitopk"], resources={"fault_tolerant": True,
                                                      "failure_schedule": "node1@5s"}).validate()


class _Keeps:
    """A group of one that keeps what it was asked to sum."""

    def __init__(self):
        self.parts = []

    def all_reduce_sum(self, tensor):
        self.parts.append(tensor.clone())


def test_the_evaluation_split_over_a_quorums_ranks_sums_to_the_whole_test_set():
    """The fault-tolerant loop's evaluation: rank r of W takes every W-th test sample and the
    quorum sums the counts; the sum of the W shares is the whole set's evaluation."""
    from thinwire.train import data, models
    from thinwire.train.config import TrainConfig
    from thinwire.train.loop import evaluate

    cfg = TrainConfig(model="mlp")
    ds = data.load(models.data_name("mlp"))
    model = models.build("mlp", 0)
    whole = _Keeps()
    evaluate(cfg, model, ds, torch.device("cpu"), share=(0, 1), group=whole)
    shares = _Keeps()
    for rank in range(3):
        evaluate(cfg, model, ds, torch.device("cpu"), share=(rank, 3), group=shares)
    summed = sum(shares.parts)
    assert summed[:2].tolist() == whole.parts[0][:2].tolist()  # correct, count: exact
    # the loss: float32 means per chunk, summed in another order
    assert float(summed[2]) == pytest.approx(float(whole.parts[0][2]), rel=1e-6)


class _Rounds:
    """A transport that records the rounds it is told of (and a cross-node group, its
    aborts)."""

    def __init__(self):
        self.calls = []

    def next_round(self):
        self.calls.append("next")

    def round_failed(self):
        self.calls.append("failed")

    def abort(self):
        self.calls.append("abort")

    def failed(self):
        return False


def _transported_step(manager, ranks_per_node=1, sync=None, **kwargs):
    """A FaultTolerantStep on ``manager`` whose transport (and cross-node group) records the
    rounds it is told of: (the step, the recorder)."""
    from types import SimpleNamespace

    model, rounds = _model(), _Rounds()
    topology = SimpleNamespace(local_rank=0, ranks_per_node=ranks_per_node,
                               world_size=2 * ranks_per_node, rank=0, nodes=2,
                               world=_AloneWorld(), inter=rounds)
    step = per_step.FaultTolerantStep(manager, topology, sync or _NoSync(), model,
                                      torch.optim.SGD(model.parameters(), lr=0.1),
                                      transport=rounds, **kwargs)
    return step, rounds


@pytest.mark.parametrize("how", ["reported", "raised", "fine"])
def test_each_quorum_opens_a_healing_round_and_a_failed_one_is_posted(how):
    """torchft reports a quorum's failure (re-forming the groups, fetching the donor's
    metadata) on that rank alone; the step tells its transport, so that a node-mate healing
    with it stops waiting for this rank's part."""
    class _Failing(_Quorum):
        def start_quorum(self):
            if how == "raised":
                raise RuntimeError("quorum lost")

        def errored(self):
            return "configure failed" if how == "reported" else None

    ft, rounds = _transported_step(_Failing(2), ranks_per_node=2)
    if how == "raised":
        with pytest.raises(RuntimeError, match="quorum lost"):
            ft.begin()
    else:
        ft.begin()
    # a failed quorum also closes this rank's cross-node group: a donor sending to it, or a
    # node evaluating with it, fails now rather than at its timeout
    assert rounds.calls == (["next"] if how == "fine" else ["next", "failed", "abort"])


def test_evaluations_fall_at_a_quorums_start_and_their_count_heals():
    """Every 2 full steps, after the next quorum: due once per multiple passed. A node that
    heals takes the count of evaluations with the state, so at the quorum where the others
    evaluate it evaluates too, and where they do not, neither does it."""
    from types import SimpleNamespace

    def step(nodes=2):
        model = _model()
        topology = SimpleNamespace(local_rank=0, ranks_per_node=1, world_size=nodes, rank=0,
                                   nodes=nodes, world=_AloneWorld(),
                                   inter=SimpleNamespace(failed=lambda: False))
        return per_step.FaultTolerantStep(_Quorum(nodes), topology, _NoSync(), model,
                                          torch.optim.SGD(model.parameters(), lr=0.1),
                                          job_nodes=2)
    ft, due = step(), []
    for _ in range(5):
        ft.begin()
        due.append(ft.evaluation_due(2))
        ft.commit()
    assert due == [False, False, True, False, True]  # at 0, 1, 2, 3, 4 full steps
    assert ft.user_state()["run"] == {"evaluations": 2, "last_commit_nodes": 2}

    back = step()  # a node back at 5 full steps heals from ft: nothing is due until 6
    back.manager.committed = ft.manager.committed
    back.load_user_state(ft.user_state())
    back.begin()
    assert not back.evaluation_due(2)
    assert back.last_commit_nodes == 2  # the last committed step's nodes, healed too
    back.manager.committed += 2  # a 6th full step
    back.begin()
    assert back.evaluation_due(2)


def test_lars_without_momentum_is_materialized_as_its_first_step_makes_it():
    # LARS keeps a momentum buffer whatever its momentum: a fresh node without one could
    # never heal into a live peer's form, and every quorum rolled back for good
    lazy, eager = _model(), _model()
    lazy_opt = LARS(lazy.parameters(), lr=0.1, momentum=0.0)
    eager_opt = LARS(eager.parameters(), lr=0.1, momentum=0.0)
    per_step.materialize_optimizer_state(eager_opt)
    _steps(lazy, lazy_opt, count=1)
    assert lazy_opt.state_dict()["state"].keys() == eager_opt.state_dict()["state"].keys()
    assert all(set(a) == set(b) for a, b in zip(lazy_opt.state_dict()["state"].values(),
                                                 eager_opt.state_dict()["state"].values()))


def test_a_node_whose_healing_is_refused_quorum_after_quorum_leaves_the_job():
    """The transport refuses a state of another form on every try: retrying cannot help.
    After HEAL_REFUSALS_MAX quorums in a row the node ends with the refusal (the others go
    on without it); another failure between them starts the count again."""
    from types import SimpleNamespace

    from thinwire.ft.state_transfer import UnsafeState

    errors = []

    class _Refusing(_Quorum):
        def errored(self):
            return errors.pop(0) if errors else None

    wrapped = RuntimeError("recovery failed")
    wrapped.__cause__ = UnsafeState("peer state has other entries: ['momentum_buffer']")
    refused = SimpleNamespace(original_exception=wrapped)  # torchft's ExceptionWithTraceback
    ft, _ = _transported_step(_Refusing(2))
    errors[:] = [refused, refused, "configure failed", refused, refused]
    for _ in range(5):
        ft.begin()  # the count starts again after another kind of failure
    assert ft.refused_heals == 2
    errors[:] = [refused]
    with pytest.raises(UnsafeState, match="refused at 3 quorums in a row .*other entries"):
        ft.begin()


def test_the_fault_tolerant_hook_gets_momentum_correction_and_weight_decay():
    # the optimizer leaves them to the hook under --momentum-correction: the fault-tolerant
    # run's SyncState must get them, as thinwire train's hook does
    from thinwire.train import TrainConfig
    from thinwire.train.grad_sync import hook_settings as sync_settings

    cfg = TrainConfig(model="mlp", algorithm="hitopk", fault_tolerant=True,
                      momentum_correction=True, momentum=0.9, weight_decay=5e-4).validate()
    settings = sync_settings(cfg)
    assert settings["momentum_correction"] == 0.9 and settings["weight_decay"] == 5e-4
    plain = sync_settings(TrainConfig(model="mlp", algorithm="hitopk", fault_tolerant=True,
                                      weight_decay=5e-4).validate())
    assert plain["momentum_correction"] == 0.0 and plain["weight_decay"] == 0.0


def test_a_node_that_heals_drops_its_residual_and_records_it():
    """It rolled back a step the others committed: part of its residual was applied by the
    steps it missed, so it starts with none, as a joining node does, and says so."""
    class _Holding(_NoSync):
        def residual_mass(self):
            return {"l1": 3.5}

    ft, _ = _transported_step(_Quorum(2), sync=_Holding(), node=1)
    ft.load_user_state(ft.user_state())
    assert ft.dropped_at_heals == [{"step": 0, "residual_l1": 3.5}] and ft.departures == []
