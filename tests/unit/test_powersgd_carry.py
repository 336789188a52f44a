"""PowerSGD's error memory carried by parameter where DDP's buckets change (a resumed run, or a
switch to PowerSGD that compresses before the new wrapper's rebuild): the mass is kept and
each bucket gets its own parameters' errors in its own order."""

from types import SimpleNamespace

import torch

from thinwire.train.grad_sync import carry_error

SIZES = [2, 3, 4]


def _state(error_dict):
    return SimpleNamespace(error_dict=error_dict, p_memory_dict={0: "p"}, q_memory_dict={0: "q"})


def _pieces():
    return [torch.arange(n, dtype=torch.float32) + 10 * i for i, n in enumerate(SIZES)]


def test_a_rebuild_hands_every_parameters_error_to_its_new_bucket():
    e = _pieces()
    # before: bucket 0 holds parameter 2, bucket 1 holds 1 then 0
    layouts = {0: (2,), 1: (1, 0)}
    state = _state({0: e[2].clone(), 1: torch.cat([e[1], e[0]])})
    loose: dict = {}
    # after the rebuild: bucket 0 holds 2 then 1, bucket 1 holds 0
    carry_error(layouts, SIZES, loose, state, 0, (2, 1), torch.zeros(7))
    assert torch.equal(state.error_dict[0], torch.cat([e[2], e[1]]))
    assert state.p_memory_dict == {} and state.q_memory_dict == {}  # warm start begins afresh
    assert set(loose) == {0}  # bucket 1's other parameter waits for its new bucket
    carry_error(layouts, SIZES, loose, state, 1, (0,), torch.zeros(2))
    assert torch.equal(state.error_dict[1], e[0])
    assert loose == {} and layouts == {0: (2, 1), 1: (0,)}


def test_an_unchanged_layout_keeps_its_memory_untouched():
    e = _pieces()
    memory = torch.cat([e[0], e[1], e[2]])
    state = _state({0: memory})
    layouts = {0: (0, 1, 2)}
    carry_error(layouts, SIZES, {}, state, 0, (0, 1, 2), torch.zeros(9))
    assert state.error_dict[0] is memory and state.p_memory_dict == {0: "p"}


def test_a_bucket_split_in_two_keeps_the_mass_and_fills_no_other_coordinates():
    e = _pieces()
    state = _state({0: torch.cat([e[0], e[1], e[2]])})
    layouts, loose = {0: (0, 1, 2)}, {}
    carry_error(layouts, SIZES, loose, state, 0, (1,), torch.zeros(3))
    carry_error(layouts, SIZES, loose, state, 1, (2, 0), torch.zeros(6))
    assert torch.equal(state.error_dict[0], e[1])
    assert torch.equal(state.error_dict[1], torch.cat([e[2], e[0]]))
    total = sum(float(t.sum()) for t in state.error_dict.values())
    assert total == sum(float(t.sum()) for t in e)


def test_a_new_memory_starts_empty_and_a_parameter_without_an_index_is_not_carried():
    state = _state({})
    carry_error({}, SIZES, {}, state, 0, (0, 1), torch.zeros(5))
    assert state.error_dict == {}  # PowerSGD makes its zeros itself
    e = _pieces()
    state = _state({0: torch.cat([e[0], e[1]])})
    layouts = {0: (0, 1)}
    carry_error(layouts, SIZES, {}, state, 0, (0, -1), torch.zeros(5))
    assert 0 not in state.error_dict


def test_a_bucket_reduced_earlier_in_the_step_with_its_own_parameters_is_not_cut():
    e = _pieces()
    # bucket 0 keeps parameter 2; bucket 1 held 1 then 0 and now holds 0 then 1
    new_error_of_0 = torch.full((4,), 7.0)  # what the step's reduction of bucket 0 left
    state = _state({0: new_error_of_0, 1: torch.cat([e[1], e[0]])})
    state.p_memory_dict = {0: "p0", 1: "p1"}
    layouts, loose = {0: (2,), 1: (1, 0)}, {}
    carry_error(layouts, SIZES, loose, state, 1, (0, 1), torch.zeros(5))
    assert state.error_dict[0] is new_error_of_0 and state.p_memory_dict == {0: "p0"}
    assert torch.equal(state.error_dict[1], torch.cat([e[0], e[1]])) and loose == {}
