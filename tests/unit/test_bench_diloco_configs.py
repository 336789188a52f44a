"""`thinwire bench diloco --configs`: each DiLoCo configuration names a recipe from one table;
a name outside it is refused before any rank launches (it used to train as hitopk's recipe)."""

import pytest

from thinwire.bench import diloco
from thinwire.bench.diloco_worker import OUTER_RECIPES, check_config_name


def test_every_recipe_with_its_interval():
    assert check_config_name("diloco-30") == ("diloco", 30)
    assert check_config_name("diloco-hitopk-10") == ("diloco-hitopk", 10)
    assert check_config_name("diloco-sparseloco-5") == ("diloco-sparseloco", 5)
    assert set(OUTER_RECIPES) == {"diloco", "diloco-hitopk", "diloco-sparseloco"}


@pytest.mark.parametrize("name", ["diloco-foo-4", "diloco-0", "diloco-x", "hitopk-4", "4"])
def test_an_unknown_configuration_is_refused_before_launch(name):
    with pytest.raises(ValueError, match=rf"--configs: unknown configuration '{name}'; "
                                         r"allowed: ddp, hitopk, diloco-H"):
        diloco.run(None, ["ddp", name], steps=1, batch=1, density=0.1, eval_every=1,
                   target_bits=None)


def _main_error(argv, capsys) -> str:
    from thinwire.cli import main

    assert main(argv) != 0
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    # the sparseloco settings without a diloco-sparseloco-H configuration
    (["--outer-bits", "4"], "--outer-bits applies to diloco-sparseloco-H; no run of this "
                            "command uses it, got --outer-bits 4"),
    (["--sparse-outer-momentum", "0.5"], "--sparse-outer-momentum applies to "
                                         "diloco-sparseloco-H"),
    # DiLoCo's settings in a race of per-step runs only
    (["--configs", "ddp", "hitopk", "--fragments", "2"],
     "--fragments applies to the DiLoCo configurations"),
    (["--configs", "ddp", "--overlap"], "--overlap applies to the DiLoCo configurations; no run "
                                        "of this command uses it, got --overlap\n"),
    (["--configs", "diloco-sparseloco-4", "--outer-lr", "0.5"],
     "--outer-lr applies to diloco-H and diloco-hitopk-H"),
    (["--configs", "diloco-4", "--outer-density", "0.1"],
     "--outer-density applies to diloco-hitopk-H"),
])
def test_a_setting_no_configuration_uses_is_refused(argv, message, capsys):
    assert message in _main_error(["bench", "diloco", "--no-shaping", *argv], capsys)


def test_the_settings_are_trains_declarations(capsys):
    """Type, range and help come from thinwire.train.settings: the same message as train's."""
    from thinwire.cli import build_parser
    from thinwire.train.settings import BY_NAME

    parser = build_parser()
    args = parser.parse_args(["bench", "diloco", "--outer-chunk", "64", "--overlap"])
    assert (args.outer_chunk, args.overlap, args.outer_bits) == (64, True,
                                                                  BY_NAME["outer_bits"].default)
    assert args.sparse_outer_momentum == 0.0 and args.outer_momentum == 0.9
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "diloco", "--outer-decay", "1.5"])
    assert f"argument --outer-decay: must be {BY_NAME['outer_decay'].allowed()}, got 1.5" \
        in capsys.readouterr().err
