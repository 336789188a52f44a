"""The registry of synchronisation modes (thinwire.train.modes): every --algorithm name in one
mode, and what each mode decides instead of a comparison of names somewhere else."""

from types import SimpleNamespace

import pytest
import torch

from thinwire import collectives
from thinwire.local_sgd.train_adapter import DiLoCoSync
from thinwire.train import auto, checkpoint_checks, compare, grad_sync, modes
from thinwire.train.config import TrainConfig
from thinwire.wavelet.schedule import check_train_config


def test_every_algorithm_name_is_in_exactly_one_mode():
    names = modes.algorithm_names()
    assert len(names) == len(set(names))
    assert set(names) == set(grad_sync.algorithm_names()) | {"diloco", "torchft-diloco", "auto"}
    for name in collectives.names() + grad_sync.TORCH_ALGORITHMS:
        assert modes.mode_of(name) is modes.PER_STEP
    assert modes.mode_of("diloco") is modes.DILOCO
    assert modes.mode_of("torchft-diloco") is modes.TORCHFT_DILOCO
    assert modes.mode_of("auto") is auto.AUTO and auto.AUTO.resolve is auto.resolve


def test_a_mode_registers_once_and_never_takes_anothers_name():
    assert modes.register(auto.AUTO) is auto.AUTO  # again: no change
    assert sum(m.name == "auto" for m in modes.MODES) == 1
    twin = modes.Mode("auto", lambda: ("auto",), None, None, None, per_step=True,
                      in_default_race=False)
    with pytest.raises(ValueError, match="a training mode named 'auto' is registered already"):
        modes.register(twin)
    thief = modes.Mode("thief", lambda: ("hitopk",), None, None, None, per_step=True,
                       in_default_race=False)
    with pytest.raises(ValueError, match=r"--algorithm names \['hitopk'\] belong to another"):
        modes.register(thief)


def test_an_unknown_name_is_refused_with_every_allowed_one():
    with pytest.raises(ValueError, match=r"--algorithm must be one of allreduce, .*powersgd, "
                                         r"diloco, torchft-diloco, auto, got 'ring'"):
        modes.mode_of("ring")
    with pytest.raises(ValueError, match="--algorithm must be one of"):
        TrainConfig(algorithm="ring").validate()


def test_compare_races_the_per_step_modes_by_default_peers_first():
    default = compare.default_algorithms()
    assert default[:3] == list(grad_sync.TORCH_ALGORITHMS)
    assert set(default) == set(modes.PER_STEP.algorithms())
    assert set(compare.algorithm_names()) == set(modes.algorithm_names())


def test_compare_runs_torchft_with_its_recipe_from_the_registry():
    settings = compare.CompareSettings(algorithms=["torchft-diloco"], shaping=False,
                                       train={"model": "mlp", "sync_every": 4,
                                              "outer_algorithm": "hitopk", "fragments": 2,
                                              "overlap": True})
    cfg = settings.run_config("torchft-diloco")
    assert (cfg.outer_algorithm, cfg.fragments, cfg.overlap) == ("allreduce", 1, False)
    cfg = settings.run_config("diloco")  # thinwire's DiLoCo keeps the user's settings
    assert (cfg.outer_algorithm, cfg.fragments, cfg.overlap) == ("hitopk", 2, True)


@pytest.mark.parametrize("algorithm", ["diloco", "torchft-diloco"])
def test_two_waves_refuse_every_mode_that_does_not_sync_every_step(algorithm):
    cfg = SimpleNamespace(**{**TrainConfig().to_dict(), "waves": 2, "algorithm": algorithm})
    with pytest.raises(ValueError, match=rf"--algorithm {algorithm} is not supported with "
                                         r"--waves 2 \(allowed: a per-step algorithm"):
        check_train_config(cfg)
    check_train_config(SimpleNamespace(**{**vars(cfg), "algorithm": "hitopk"}))


def test_a_per_step_sync_has_nothing_to_attach_finish_or_close():
    sync = grad_sync.Sync("ddp")
    sync.attach(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    sync.finish(stopped=False)
    sync.close()
    assert sync.state_dict() is None


@pytest.mark.parametrize("stopped,flushes", [(False, 1), (True, 0)])
def test_diloco_lands_its_exchange_in_flight_unless_the_run_stopped_to_resume(stopped, flushes):
    sync = DiLoCoSync.__new__(DiLoCoSync)  # only what finish() touches
    calls = []
    sync.diloco = SimpleNamespace(flush=lambda: calls.append(1))
    sync.finish(stopped)
    assert len(calls) == flushes


def test_each_mode_checks_its_own_checkpoint_state():
    numel = [(2, 3), (4,)]  # the parameters' shapes
    inner = {"steps": 3, "feedback": {"enabled": True, "residuals": {}, "velocities": {}}}
    good = {"inner_steps": 2, "pending": {}, "anchor": [torch.zeros(2, 3), torch.zeros(4)],
            "momentum": [torch.zeros(2, 3), torch.zeros(4)], "sync": inner}
    modes.DILOCO.check_hook(good, "diloco", numel)
    bad = {**good, "sync": {**inner, "steps": -1}}
    with pytest.raises(ValueError, match=r"hook\.sync\.steps"):
        modes.DILOCO.check_hook(bad, "diloco", numel)
    # a one-element anchor would load by broadcasting: refused by shape
    broadcast = {**good, "anchor": [torch.zeros(1), torch.zeros(1)]}
    with pytest.raises(ValueError, match=r"field 'hook\.anchor' is \[\(1,\), \(1,\)\], "
                                         r"expected 2 floating tensors shaped like the "
                                         r"parameters"):
        modes.DILOCO.check_hook(broadcast, "diloco", numel)
    nan = {**good, "momentum": [torch.zeros(2, 3), torch.tensor([0.0, float("nan"), 0, 0])]}
    with pytest.raises(ValueError, match=r"field 'hook\.momentum\[1\]' is 'a NaN or Inf', "
                                         r"expected finite values"):
        modes.DILOCO.check_hook(nan, "diloco", numel)
    modes.PER_STEP.check_hook(inner, "hitopk", numel)
    modes.PER_STEP.check_hook(None, "ddp", numel)
    with pytest.raises(ValueError, match=r"None \(--algorithm ddp keeps no state\)"):
        modes.PER_STEP.check_hook(inner, "ddp", numel)
    with pytest.raises(ValueError, match=r"None \(--algorithm torchft-diloco keeps no state\)"):
        modes.TORCHFT_DILOCO.check_hook({}, "torchft-diloco", numel)
    assert checkpoint_checks.check_no_hook(None, "ddp") is None
