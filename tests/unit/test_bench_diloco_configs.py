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
