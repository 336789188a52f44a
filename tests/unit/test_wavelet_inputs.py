"""Wavelet's bad input, layout and memory readings (no processes started)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from thinwire.train.config import TrainConfig
from thinwire.train.entry import main as train_main
from thinwire.wavelet import Wave, check_turn, check_waves, memory


@pytest.mark.parametrize("waves", [3, 0, -1, 2.0, True, "2"])
def test_waves_other_than_one_or_two_refused(waves):
    with pytest.raises(ValueError, match=r"--waves must be 1 .* or 2 .*only two waves are "
                                         r"supported, got " + repr(waves).replace(".", r"\.")):
        TrainConfig(waves=waves).validate()


def test_cli_waves_3_is_a_clear_error(capsys):
    assert train_main(["--waves", "3"]) == 2
    err = capsys.readouterr().err
    assert "--waves must be 1" in err and "got 3" in err


def test_wave_turn_checked():
    with pytest.raises(ValueError, match="--wave-turn must be one of forward, backward"):
        TrainConfig(waves=2, wave_turn="sideways").validate()
    assert check_turn("forward") == "forward"


@pytest.mark.parametrize("option,value", [("checkpoint", "ckpt"), ("algorithm", "diloco"),
                                          ("amp", "bf16"), ("metrics", "m.jsonl"),
                                          ("eval_every", 5)])
def test_options_the_wave_loop_lacks_are_refused(option, value):
    kwargs = {option: value, "sync_every": 4} if option == "algorithm" else {option: value}
    with pytest.raises(ValueError, match="not supported with --waves 2|with --waves 2"):
        TrainConfig(waves=2, **kwargs).validate()


def test_the_wave_loop_takes_its_device_from_device():
    from thinwire.wavelet.loop import _device

    wave = SimpleNamespace(local_rank=0, waves=2)
    assert _device(wave, "cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert _device(wave, "auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="--device cuda: no CUDA device is available"):
            _device(wave, "cuda")


def test_layout_two_slots_per_node():
    waves = [Wave(rank, 8, rank % 4, 4) for rank in range(8)]
    assert [w.index for w in waves] == [0, 1] * 4
    assert [w.slot for w in waves] == [0, 0, 1, 1] * 2
    assert [w.node for w in waves] == [0] * 4 + [1] * 4
    assert waves[5].slot_ranks == [4, 5] and waves[2].slot_ranks == [2, 3]
    assert check_waves(1) == 1


def test_odd_processes_per_node_refused():
    with pytest.raises(ValueError, match="multiple of 2, got 3"):
        Wave(0, 3, 0, 3)


def test_memory_limit_below_one_wave_peak_refused():
    mib = 2 ** 20
    with pytest.raises(ValueError) as info:
        memory.check_node_limit(300 * mib, 420 * mib, 256, 1)
    text = str(info.value)
    assert "--node-memory" in text and "300MiB" in text and ">= 420MiB" in text
    assert "one wave's estimated peak of 420MiB at --batch-size 256" in text
    memory.check_node_limit(None, 420 * mib, 256, 1)  # no limit: nothing to check
    memory.check_node_limit(420 * mib, 420 * mib, 256, 1)
    # two waves: the other wave's valley (its resident memory) comes on top
    with pytest.raises(ValueError, match=r"is 500MiB, below the 570MiB two waves need at least "
                                         r"\(one wave's estimated peak of 420MiB plus the other "
                                         r"wave's valley of 150MiB\).*>= 570MiB"):
        memory.check_node_limit(500 * mib, 420 * mib, 256, 2, valley=150 * mib)


def test_peak_estimate_counts_every_slot():
    assert memory.estimate_wave_peak(100, 10.0, 8, slots=2) == 2 * (100 + 80)


@pytest.mark.parametrize("version", [1, 2])
def test_node_memory_read_from_the_cgroup(tmp_path, version):
    if version == 1:
        folder = tmp_path / "memory" / "node"
        folder.mkdir(parents=True)
        (folder / "memory.limit_in_bytes").write_text("1073741824\n")
        (folder / "memory.usage_in_bytes").write_text("5000\n")
        line = "4:memory:/node\n"
    else:
        folder = tmp_path / "node"
        folder.mkdir(parents=True)
        (folder / "memory.max").write_text("1073741824\n")
        (folder / "memory.current").write_text("5000\n")
        line = "0::/node\n"
    proc = tmp_path / "cgroup"
    proc.write_text(line)
    node = memory.NodeMemory(memory._memory_cgroup_dir(proc, (tmp_path / "absent", tmp_path)))
    assert node.limit_bytes() == 2 ** 30 and node.usage_bytes() == 5000
    (folder / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(
        str(1 << 62) if version == 1 else "max")
    assert node.limit_bytes() is None


def test_saved_activations_grow_with_the_batch():
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def loss(x):
        return model(x).square().mean()
    small = memory.saved_activation_bytes(loss, torch.randn(4, 16))
    large = memory.saved_activation_bytes(loss, torch.randn(8, 16))
    # per sample: the input (16), the first output (64, kept by the ReLU) and the second
    # layer's input (64, shared storage with the ReLU output or not); weights are shared
    assert large - small >= 4 * (16 + 64) * 4


def test_anon_memory_of_this_process_is_read():
    assert memory.anon_bytes() > 10 * 2 ** 20
    assert memory.anon_bytes(2 ** 22 + 12345) is None  # no such process


def test_node_limit_from_the_launcher_when_the_cgroup_is_out_of_sight(monkeypatch):
    monkeypatch.setenv("THINWIRE_NODE_MEMORY_BYTES", str(2 ** 30))
    node = memory.NodeMemory.__new__(memory.NodeMemory)
    node.found = None
    assert node.limit_bytes() == 2 ** 30 and node.usage_bytes() is None
