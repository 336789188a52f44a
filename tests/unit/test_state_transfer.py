"""Healing from a peer without pickle (thinwire.ft.state_transfer): a state dict crosses a
gloo process group as a JSON header and raw tensor bytes and arrives bit-identical; a lying
header is refused before anything is allocated. Two ranks are two threads of this process,
each with its own ProcessGroupGloo on one store (as torchft's replica groups are)."""

from __future__ import annotations

import ast
import datetime
import json
import pickle
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from thinwire.ft import state_transfer as st

TIMEOUT = datetime.timedelta(seconds=20)


def _state():
    g = torch.Generator().manual_seed(0)
    return {"user": {"model": {"w": torch.randn(3, 4, generator=g, dtype=torch.float64),
                               "b": torch.randn(4, generator=g).to(torch.bfloat16),
                               "mask": torch.rand(5, generator=g) > 0.5,
                               "empty": torch.zeros(0, 3),
                               "steps": torch.tensor(7)},
                     "fragment": [torch.ones(2, dtype=torch.int32), {"lr": 0.1}],
                     "pair": (1, "two"), "none": None, "nan": float("nan"), "inf": float("-inf"),
                     "nothing": {}, "no_list": [], "no_tuple": ()},
            "torchft": {"step": 12, "batches_committed": 48}}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                            b.view(-1).view(torch.uint8) if b.numel() else b)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_the_format_round_trips_every_kind_of_leaf():
    state = _state()
    header, tensors = st.describe(st.flatten(state), step=12)
    leaves = st.parse_header(header, 12, max_bytes=10 ** 6)
    assert _same(st.rebuild(leaves, tensors), state)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_peer_tensor_that_is_not_finite_is_refused(bad):
    # plain float leaves may be NaN (a metric not measured yet); a weight, moment or residual
    # that is not finite would be trained on
    state = _state()
    state["user"]["model"]["w"][1, 2] = bad
    header, tensors = st.describe(st.flatten(state), step=12)
    leaves = st.parse_header(header, 12, max_bytes=10 ** 6)
    with pytest.raises(st.UnsafeState, match=r"tensor at \['user'\]\['model'\]\['w'\] holds "
                                             r"non-finite values"):
        st.rebuild(leaves, tensors)


def _pair(sender, receiver):
    store, result, errors = dist.HashStore(), {}, []

    def run(rank):
        try:
            pg = dist.ProcessGroupGloo(store, rank, 2, TIMEOUT)
            result[rank] = (sender if rank == 0 else receiver)(pg)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return result, errors


def test_a_state_crosses_a_gloo_group_bit_identical():
    state = _state()
    transport = lambda pg: st.DataOnlyTransport(pg, TIMEOUT, own_state=_state)  # noqa: E731
    receiver = {}

    def receive(pg):
        receiver["transport"] = transport(pg)
        return receiver["transport"].recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT)
    before = time.time()
    result, errors = _pair(
        lambda pg: transport(pg).send_checkpoint([1], 12, state, TIMEOUT), receive)
    assert not errors, errors
    assert _same(result[1], state)
    [(began, ended)] = receiver["transport"].healings  # where a rejoin's time went
    assert before <= began <= ended <= time.time()


def test_a_refused_healing_is_timed_too():
    transport = st.DataOnlyTransport(None, TIMEOUT, own_state=dict)
    with pytest.raises(st.UnsafeState):
        transport.recv_checkpoint(0, "http://10.0.0.2:8000/checkpoint/12", 12, TIMEOUT)
    assert len(transport.healings) == 1


def _node_state(local_rank: int):
    """A Manager's state as a node's rank holds it: model, optimizer and schedule alike on
    every rank of the node, the SyncState its own."""
    g = torch.Generator().manual_seed(1)
    model = {"w": torch.randn(37, 5, generator=g), "b": torch.randn(3, generator=g).double(),
             "none": torch.zeros(0)}
    optimizer = {"state": {0: {"momentum_buffer": torch.randn(37, 5, generator=g)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    sync = {"step": 10 + local_rank, "threshold": torch.full((3,), float(local_rank))}
    return {"user": {"default": {"model": model, "optimizer": optimizer,
                                 "scheduler": {"last_epoch": 4}, "sync": sync}},
            "torchft": {"step": 12, "batches_committed": 48}}


class _CountingGroup:
    """A process group that counts the bytes its sends carry."""

    def __init__(self, pg, counts: list):
        self._pg, self._counts = pg, counts

    def send(self, tensors, dst, tag):
        self._counts.append(sum(t.numel() * t.element_size() for t in tensors))
        return self._pg.send(tensors, dst, tag)

    def __getattr__(self, name):
        return getattr(self._pg, name)


def _two_nodes(receive, silent_donor: int | None = None, step: int = 12):
    """Node 0 (two ranks) sends its state to node 1 (two ranks), local rank j to local rank j
    over their own group, as torchft pairs them; node 1's ranks share the state's common part
    over their node's group (``silent_donor``: that local rank of node 0 sends nothing). Returns
    (received by local rank, errors, bytes each donor sent)."""
    from thinwire.ft.per_step import node_shared

    cross = [dist.HashStore() for _ in range(2)]
    nodes = [dist.HashStore() for _ in range(2)]
    heal_stores = [dist.HashStore() for _ in range(2)]  # each node's, where its ranks agree
    result, errors, sent = {}, [], {0: [], 1: []}

    def run(node, local):
        try:
            node_group = dist.ProcessGroupGloo(nodes[node], local, 2, TIMEOUT)
            pg = dist.ProcessGroupGloo(cross[local], node, 2, TIMEOUT)
            transport = st.DataOnlyTransport(
                _CountingGroup(pg, sent[local]), TIMEOUT,
                own_state=lambda: _node_state(local), node_group=node_group,
                node_shared=node_shared, node_store=heal_stores[node])
            transport.next_round()  # as FaultTolerantStep.begin opens one per quorum
            if node == 0 and local != silent_donor:
                transport.send_checkpoint([1], step, _node_state(local), TIMEOUT)
            elif node == 1:
                result[local] = receive(transport, local)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(n, j)) for n in range(2) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return result, errors, sent


def test_a_nodes_common_state_crosses_once_split_across_its_ranks():
    """Every rank gets its donor's state bit-identical; the model and optimizer crossed once
    for the node (each donor sent half of them), the SyncState whole to each rank."""
    result, errors, sent = _two_nodes(
        lambda transport, local: transport.recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT))
    assert not errors, errors
    for local in range(2):
        assert _same(result[local], _node_state(local))
    common = sum(t.numel() * t.element_size() for part in ("model", "optimizer")
                 for _, t in st.flatten(_node_state(0)["user"]["default"][part])
                 if isinstance(t, torch.Tensor))
    per_rank = 3 * 4  # the SyncState's threshold
    for local in range(2):
        headers = sum(sent[local][:2])
        assert sum(sent[local]) - headers <= common / 2 + 64 + per_rank, sent[local]


def test_at_step_0_a_rank_heals_alone_with_the_whole_state():
    """torchft's init_sync heals rank by rank at step 0 (local rank 1 here is its rank's
    primary and fetches nothing): the state travels whole, nobody waits on a node-mate."""
    def receive(transport, local):
        if local == 0:
            return transport.recv_checkpoint(0, "thinwire-state/1", 0, TIMEOUT)
    result, errors, _ = _two_nodes(receive, silent_donor=1, step=0)
    assert not errors, errors
    assert _same(result[0], _node_state(0)) and result[1] is None


def test_one_ranks_failed_part_fails_every_rank_of_the_node_within_the_timeout():
    """Local rank 1's donor is gone (it sends nothing; its receiver's wait fails at once);
    rank 0's part arrives, but it must not use a state half of which is missing: both fail,
    neither hangs."""
    def receive(transport, local):
        if local == 1:  # what a lost donor looks like to this rank, without the wait
            transport._pg = None
        return transport.recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT)

    result, errors, _ = _two_nodes(receive, silent_donor=1)
    assert not result and len(errors) == 2, errors
    assert any("healing failed on local rank(s) [1]" in str(e) for e in errors), errors


def test_a_rank_whose_quorum_failed_before_the_transport_fails_its_node_mate_at_once():
    """torchft fails local rank 1 while it re-forms its cross-node group (it never reaches the
    transport, and goes on to its step); rank 0's part arrives, but it must not wait for rank
    1's (nor pair the agreement with rank 1's next collective on the node's group): it fails
    at once, far within the timeout."""
    import time

    elapsed = {}

    def receive(transport, local):
        if local == 1:
            transport.round_failed()
            return None
        start = time.monotonic()
        try:
            return transport.recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT)
        finally:
            elapsed[local] = time.monotonic() - start

    result, errors, _ = _two_nodes(receive)
    # (rank 1's donor fails too: what it sends is never received, torchft reports that)
    refused = [e for e in errors if isinstance(e, st.UnsafeState)]
    assert result == {1: None} and len(refused) == 1, (result, errors)
    assert "healing failed on local rank(s) [1]" in str(refused[0]), errors
    assert elapsed[0] < TIMEOUT.total_seconds() / 4, elapsed


def test_a_split_healing_without_a_round_of_its_own_is_refused():
    """The agreement's keys are the round's: a second healing in the same round would read the
    first one's statuses (a caller that never opens rounds would heal once, then misread)."""
    def receive(transport, local):
        first = transport.recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT)
        with pytest.raises(ValueError, match="needs a round of its own"):
            transport.recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT)
        return first
    result, errors, _ = _two_nodes(receive)
    assert not errors, errors
    assert all(_same(result[local], _node_state(local)) for local in range(2))


def test_a_split_state_needs_the_nodes_store():
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, TIMEOUT)

    class _Two:  # a node of two ranks, as the transport sees it
        size, rank = staticmethod(lambda: 2), staticmethod(lambda: 0)
    with pytest.raises(ValueError, match="node_store"):
        st.DataOnlyTransport(group, TIMEOUT, own_state=dict, node_group=_Two(),
                             node_shared=lambda path: True)


def _on(device, state):
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _on(device, v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_on(device, v) for v in state)
    return state


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: the GPU machine runs it (tests/gpu/on_device.sh)")
def test_a_state_on_the_gpu_crosses_a_gloo_group_through_host_memory():
    """gloo's send takes host memory: the sender stages a GPU state there; it arrives on the
    host, bit-identical (the Manager's load_state_dict copies it into place)."""
    state = _on("cuda", _state())
    transport = lambda pg: st.DataOnlyTransport(pg, TIMEOUT, own_state=_state)  # noqa: E731
    result, errors = _pair(
        lambda pg: transport(pg).send_checkpoint([1], 12, state, TIMEOUT),
        lambda pg: transport(pg).recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT))
    assert not errors, errors
    assert _same(result[1], _state())


def _send_raw(header: bytes):
    def send(pg):
        pg.send([torch.tensor([len(header)], dtype=torch.int64)], 1, 1).wait(TIMEOUT)
        pg.send([torch.frombuffer(bytearray(header), dtype=torch.uint8)], 1, 2).wait(TIMEOUT)
    return send


def _header(leaves, step=12):
    return json.dumps({"format": "thinwire-state/1", "step": step, "leaves": leaves}).encode()


@pytest.mark.parametrize("header, message", [
    (pickle.dumps({"step": 12}), "not JSON"),
    (_header([], step=11), "of step 11, the quorum agreed on 12"),
    (_header([{"path": [["d", "w"]], "kind": "tensor", "dtype": "object", "shape": [2]}]),
     "dtype 'object'"),
    (_header([{"path": [["d", "w"]], "kind": "tensor", "dtype": "float32", "shape": [-1]}]),
     "shape"),
    (_header([{"path": [["d", "w"]], "kind": "tensor", "dtype": "float32",
               "shape": [1 << 20, 1 << 20]}]), "more than"),
    (_header([{"path": [["d", "w"]], "kind": "value", "value": {"__reduce__": 1}}]),
     "not accepted"),
    (_header([{"path": [["x", "w"]], "kind": "value", "value": 1}]), "no valid path"),
], ids=["pickle", "step", "dtype", "negative-shape", "too-large", "nested-value", "path"])
def test_a_lying_header_is_refused_before_any_tensor_is_allocated(header, message):
    own = lambda: {"w": torch.zeros(1000)}  # noqa: E731 - the cap: 1 MiB minimum
    result, errors = _pair(
        _send_raw(header),
        lambda pg: st.DataOnlyTransport(pg, TIMEOUT, own_state=own).recv_checkpoint(
            0, "thinwire-state/1", 12, TIMEOUT))
    assert len(errors) == 1 and isinstance(errors[0], st.UnsafeState), errors
    assert message in str(errors[0])


def test_a_peer_with_another_transport_is_refused():
    transport = st.DataOnlyTransport(None, TIMEOUT, own_state=dict)
    with pytest.raises(st.UnsafeState, match="healing needs thinwire's"):
        transport.recv_checkpoint(0, "http://10.0.0.2:8000/checkpoint/12", 12, TIMEOUT)


def test_a_state_that_cannot_travel_as_data_is_refused_by_the_sender():
    with pytest.raises(st.UnsafeState, match=r"\['opt'\] is a object"):
        st.describe(st.flatten({"opt": object()}), 1)


def test_the_module_never_unpickles():
    tree = ast.parse(Path(st.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import,
                                                                          ast.ImportFrom))
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                             if isinstance(node, ast.ImportFrom)}
    loads = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "loads")]
    assert not imported & {"pickle", "dill", "cloudpickle", "marshal"}
    assert loads and all(isinstance(f.value, ast.Name) and f.value.id == "json" for f in loads)


@pytest.mark.parametrize("theirs, message", [
    ({"w": torch.zeros(3, 5)}, "(3, 5)), this replica has"),    # another shape
    ({"w": torch.zeros(3, 4, dtype=torch.float64)}, "float64"),  # another dtype
    ({"w": torch.zeros(3, 4), "x": torch.zeros(1)}, "extra"),   # an entry more
    ({"w": torch.zeros(3, 4), "step": "12"}, "'str'"),          # a value of another type
])
def test_a_peer_state_of_another_form_is_refused_before_its_tensors(theirs, message):
    mine = {"w": torch.zeros(3, 4), "step": 12}
    if "step" not in theirs and "x" not in theirs:
        theirs = dict(theirs, step=12)
    header, _ = st.describe(st.flatten(theirs), 12)
    result, errors = _pair(
        _send_raw(header),
        lambda pg: st.DataOnlyTransport(pg, TIMEOUT, own_state=lambda: mine).recv_checkpoint(
            0, "thinwire-state/1", 12, TIMEOUT))
    assert len(errors) == 1 and isinstance(errors[0], st.UnsafeState), errors
    assert message in str(errors[0])


def test_a_header_far_larger_than_this_replicas_is_refused_unread():
    own = lambda: {"w": torch.zeros(2)}  # noqa: E731
    huge = (1 << 20)
    def send(pg):
        pg.send([torch.tensor([huge], dtype=torch.int64)], 1, 1).wait(TIMEOUT)
    result, errors = _pair(send, lambda pg: st.DataOnlyTransport(
        pg, TIMEOUT, own_state=own).recv_checkpoint(0, "thinwire-state/1", 12, TIMEOUT))
    assert len(errors) == 1 and "header of 1048576 bytes" in str(errors[0]), errors


def test_a_shape_of_many_huge_dimensions_is_refused_quickly():
    import time
    shape = [2**47] * 100_000
    start = time.monotonic()
    with pytest.raises(st.UnsafeState, match="not accepted"):
        st.parse_header(_header([{"path": [["d", "w"]], "kind": "tensor", "dtype": "float32",
                                  "shape": shape}]), 12, 10**6)
    with pytest.raises(st.UnsafeState, match="more than"):
        st.parse_header(_header([{"path": [["d", "w"]], "kind": "tensor", "dtype": "float32",
                                  "shape": [2**47] * 16}]), 12, 10**6)
    assert time.monotonic() - start < 5


def test_a_state_split_otherwise_than_this_node_expects_is_refused():
    """A whole state where the node expects slice 0 of 2, slice 1 where it expects 0, and a
    split where it expects the whole: refused by the header, before any tensor."""
    split = json.dumps({"format": "thinwire-state/1", "step": 12, "leaves": [],
                        "slice": 1, "slices": 2}).encode()
    with pytest.raises(st.UnsafeState, match="split as"):
        st.parse_header(_header([]), 12, 10**6, slices=(0, 2))
    with pytest.raises(st.UnsafeState, match="split as"):
        st.parse_header(split, 12, 10**6, slices=(0, 2))
    with pytest.raises(st.UnsafeState, match="split as"):
        st.parse_header(split, 12, 10**6)
    assert st.parse_header(split, 12, 10**6, slices=(1, 2)) == []
