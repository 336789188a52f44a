"""Healing a replica from a live peer without unpickling the peer's bytes.

torchft's two checkpoint transports hand a joining replica the state of a peer that an
unauthenticated quorum names: the HTTP one (its default) unpickles it (``torch.load`` with
``weights_only`` off) and serves it from a server bound to every interface; the
process-group one sends its structure with ``pickle``. Either way a peer that lies runs code
on the replica that trusts it.

:class:`DataOnlyTransport` is torchft's ``CheckpointTransport`` over the replica groups'
own process group (no server, no extra port), and what crosses it is data only:

1. the header's length (one int64), then the header: JSON describing every leaf of the
   state dict (its place in the nesting, and for a tensor its dtype from a fixed list and
   its shape; for a number, string, bool or None the value itself);
2. each tensor's raw bytes, in the header's order, into a buffer of exactly the size the
   header announced.

The receiver checks the header before it allocates anything: the step is the one the quorum
agreed, dtypes are in the list, shapes are non-negative, and the total is under a cap (by
default 1.5 times the receiver's own state: a peer cannot make it allocate 1 TB). Tensors
leave and arrive in host memory (a GPU state is staged through it: the Manager's group is gloo);
the Manager's ``load_state_dict`` copies them into place.

**Split across a node's ranks.** torchft heals local rank j of a joining node from local rank j
of a live one, so each of a node's ranks fetched the whole state over the node's one link: 2
ranks, twice the bytes (2 x 26 MB took 4.2 s of a 100 Mbit/s rejoin). What every rank of a node
holds alike (``node_shared``: the model, the optimizer and its schedule; data-parallel ranks
apply the same update) now travels once per node: rank j fetches the j-th of ``n`` equal byte
slices of it, and the node's ranks all-gather the slices over their own group (loopback). What
differs by rank (thinwire's SyncState) travels whole to each. Before any slice is used the
node's ranks agree, through the node's store, that each fetched its part with one layout (a
digest of the shared entries). The agreement goes through the store, not the node's group,
because torchft can fail a rank before it reaches the transport (re-forming its cross-node
group, fetching its donor's metadata: per rank): such a rank posts its failure for the round
(:meth:`DataOnlyTransport.round_failed`) and goes on to its step, whose collectives on the
node's group would otherwise have been paired with a node-mate's agreement. One rank's failure,
wherever it happens, fails every rank of the node's healing as soon as that rank's quorum
returns (within the timeout: a rank whose donor's metadata hangs waits that long).
"""

from __future__ import annotations

import json
import math
import reprlib
import time
from datetime import timedelta
from typing import Any, Callable

import torch

DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}
MAX_HEADER_BYTES = 64 << 20  # absolute ceiling; the receiver's own header sets a lower one
MAX_DIMS = 16
_HEADER_TAG, _LENGTH_TAG, _SLICE_TAG, _FIRST_TENSOR_TAG = 2, 1, 4, 5
_POLL_S = 0.005  # how often a rank looks for its node-mates' parts in the node's store
_ALIGN = 16  # bytes: every shared tensor starts at a multiple (a dtype view needs it)

try:  # torchft is an optional peer: the format below does not need it
    from torchft.checkpointing.transport import CheckpointTransport
except ImportError:  # pragma: no cover - torchft is in the project's requirements
    CheckpointTransport = object


class UnsafeState(ValueError):
    """A peer's header or state does not have the form this module accepts."""


# ------------------------------------------------------------------ the format (pure functions)

def flatten(state: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, leaf) for every leaf of nested dicts / lists / tuples; a path step is
    ("d", key) or ("l", index) / ("t", index)."""
    if isinstance(state, dict):
        out = []
        for key, value in state.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise UnsafeState(f"state key {key!r} at {_show(path)} is a "
                                  f"{type(key).__name__}: only str and int keys travel")
            out.extend(flatten(value, path + (("d", key),)))
        return out or [(path, {})]
    if isinstance(state, (list, tuple)):
        kind = "l" if isinstance(state, list) else "t"
        out = []
        for index, value in enumerate(state):
            out.extend(flatten(value, path + ((kind, index),)))
        return out or [(path, [] if kind == "l" else ())]
    return [(path, state)]


def describe(leaves: list[tuple[tuple, Any]], step: int,
             with_tensors: bool = True, slices: tuple[int, int] | None = None
             ) -> tuple[bytes, list[torch.Tensor]]:
    """The header (JSON bytes) and the tensors, contiguous on the CPU, in header order
    (``with_tensors=False``: the header alone, no tensor is touched). ``slices``: (this
    rank's slice j, slices n) where the node-shared tensors travel split across a node's
    ranks; the header says so."""
    entries, tensors = [], []
    for path, leaf in leaves:
        entry: dict[str, Any] = {"path": [list(p) for p in path]}
        if isinstance(leaf, torch.Tensor):
            name = str(leaf.dtype).removeprefix("torch.")
            if name not in DTYPES:
                raise UnsafeState(f"tensor at {_show(path)} has dtype {leaf.dtype}, not one of "
                                  f"{sorted(DTYPES)}")
            entry.update(kind="tensor", dtype=name, shape=list(leaf.shape))
            if with_tensors:
                tensors.append(leaf.detach().to("cpu").contiguous())
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            if isinstance(leaf, float) and not math.isfinite(leaf):
                entry.update(kind="float", value=repr(leaf))
            else:
                entry.update(kind="value", value=leaf)
        elif leaf == {} or leaf == [] or leaf == ():
            entry.update(kind="empty", value={dict: "d", list: "l", tuple: "t"}[type(leaf)])
        else:
            raise UnsafeState(f"state leaf at {_show(path)} is a {type(leaf).__name__}: only "
                              "tensors, numbers, strings, bools and None travel")
        entries.append(entry)
    meta = {"format": "thinwire-state/1", "step": int(step), "leaves": entries}
    if slices is not None:
        meta["slice"], meta["slices"] = slices
    header = json.dumps(meta, allow_nan=False).encode()
    return header, tensors


def parse_header(header: bytes, step: int, max_bytes: int,
                 slices: tuple[int, int] | None = None) -> list[dict]:
    """The header's leaves, checked: format, step, dtypes, shapes, total size, and that the
    sender split the node-shared tensors as this receiver expects (``slices``, as in
    :func:`describe`; None: not split)."""
    try:
        meta = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnsafeState(f"peer state header is not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != "thinwire-state/1":
        raise UnsafeState("peer state header is not thinwire-state/1")
    if meta.get("step") != step:
        raise UnsafeState(f"peer state is of step {meta.get('step')!r}, the quorum agreed on "
                          f"{step}")
    theirs = (meta.get("slice"), meta.get("slices")) if "slices" in meta else None
    if theirs != (tuple(slices) if slices is not None else None):
        raise UnsafeState(f"peer state is split as (slice, slices) {_short(theirs)}, this "
                          f"replica expects {slices}")
    leaves = meta.get("leaves")
    if not isinstance(leaves, list):
        raise UnsafeState("peer state header has no list of leaves")
    total = 0
    for entry in leaves:
        if not isinstance(entry, dict) or not _valid_path(entry.get("path")):
            raise UnsafeState(f"peer state leaf {_short(entry)} has no valid path")
        kind = entry.get("kind")
        if kind == "tensor":
            shape = entry.get("shape")
            if entry.get("dtype") not in DTYPES or not isinstance(shape, list) \
                    or len(shape) > MAX_DIMS or not all(
                        isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**48
                        for n in shape):
                raise UnsafeState(f"peer tensor at {_short(entry['path'])}: dtype "
                                  f"{_short(entry.get('dtype'))}, shape {_short(shape)} not "
                                  "accepted")
            size = DTYPES[entry["dtype"]].itemsize
            for n in shape:  # one dimension at a time: a product past the cap stops here
                size *= n
                if total + size > max_bytes:
                    break
            total += size
        elif not _valid_value(kind, entry.get("value")):
            raise UnsafeState(f"peer state leaf of kind {_short(kind)} with value "
                              f"{_short(entry.get('value'))} not accepted")
        if total > max_bytes:
            raise UnsafeState(f"peer state announces more than {max_bytes} bytes of tensors "
                              "(the cap, set by this replica's own state)")
    return leaves


def _short(value) -> str:
    """A bounded repr for messages (a crafted header's values can be megabytes)."""
    return reprlib.repr(value)


def check_structure(leaves: list[dict], own: list[dict]) -> None:
    """The peer's leaves against this replica's own: the same paths, and at each the same
    tensor dtype and shape, or a plain value of the same type. A healed replica loads what it
    already has the form of; a peer cannot hand it a differently shaped or typed state."""
    def form(entry):
        if entry["kind"] == "tensor":
            return ("tensor", entry["dtype"], tuple(entry["shape"]))
        if entry["kind"] == "float":
            return ("value", "float")
        if entry["kind"] == "empty":
            return ("empty", entry["value"])
        return ("value", type(entry["value"]).__name__)

    theirs = {json.dumps(e["path"]): form(e) for e in leaves}
    mine = {json.dumps(e["path"]): form(e) for e in own}
    if len(theirs) != len(leaves):
        raise UnsafeState("peer state places two leaves at one path")
    if theirs.keys() != mine.keys():
        extra, missing = sorted(theirs.keys() - mine.keys()), sorted(mine.keys() - theirs.keys())
        raise UnsafeState(f"peer state has other entries than this replica's: extra "
                          f"{_short(extra)}, missing {_short(missing)}")
    differ = [path for path in mine if mine[path] != theirs[path]
              and {mine[path], theirs[path]} != {("value", "int"), ("value", "float")}]
    if differ:
        path = differ[0]
        raise UnsafeState(f"peer state at {path}: {_short(theirs[path])}, this replica has "
                          f"{_short(mine[path])} ({len(differ)} entries differ)")


def rebuild(leaves: list[dict], tensors: list[torch.Tensor]) -> Any:
    """The nested state from checked leaves and their received tensors."""
    root: Any = None
    received = iter(tensors)
    for entry in leaves:
        kind = entry["kind"]
        if kind == "tensor":
            leaf = next(received)
            # weights, moments and residuals that are not finite would be trained on: a
            # donor's damaged state is refused like a misshapen one
            if leaf.is_floating_point() and not bool(torch.isfinite(leaf).all()):
                raise UnsafeState(f"peer state tensor at {_show(entry['path'])} holds "
                                  f"non-finite values")
        elif kind == "float":
            leaf = float(entry["value"])
        elif kind == "empty":
            leaf = {"d": {}, "l": [], "t": []}[entry["value"]]
        else:
            leaf = entry["value"]
        root = _place(root, entry["path"], leaf)
    return _tuples(root, leaves)


def _place(node: Any, path: list, leaf: Any) -> Any:
    """``node`` with ``leaf`` put at ``path``; a leaf placed twice, a list index out of
    order or a step that contradicts the container is refused."""
    if not path:
        if node is not None:
            raise UnsafeState("peer state places two leaves at one path")
        return leaf
    (kind, key), rest = path[0], path[1:]
    if node is None:
        node = {} if kind == "d" else []
    if isinstance(node, dict) != (kind == "d") or not isinstance(node, (dict, list)):
        raise UnsafeState(f"peer state path step {kind!r}:{key!r} contradicts its container")
    if kind == "d":
        node[key] = _place(node.get(key), rest, leaf)
    elif key == len(node):
        node.append(_place(None, rest, leaf))
    elif key < len(node):
        node[key] = _place(node[key], rest, leaf)
    else:
        raise UnsafeState(f"peer state list index {key} out of order")
    return node


def _tuples(root: Any, leaves: list[dict]) -> Any:
    """Lists the sender had as tuples become tuples again (torchft's own state has none;
    kept for a faithful round trip)."""
    tuple_paths = {tuple(tuple(s) for s in e["path"][:i])
                   for e in leaves for i, step in enumerate(e["path"]) if step[0] == "t"}
    tuple_paths |= {tuple(tuple(s) for s in e["path"]) for e in leaves
                    if e["kind"] == "empty" and e["value"] == "t"}

    def convert(node, path):
        if isinstance(node, dict):
            return {k: convert(v, path + (("d", k),)) for k, v in node.items()}
        if isinstance(node, list):
            kind = "t" if path in tuple_paths else "l"
            items = [convert(v, path + ((kind, i),)) for i, v in enumerate(node)]
            return tuple(items) if kind == "t" else items
        return node
    return convert(root, ())


def _valid_value(kind, value) -> bool:
    if kind == "value":
        return value is None or isinstance(value, (bool, int, float, str))
    if kind == "float":
        return value in ("nan", "inf", "-inf")
    return kind == "empty" and value in ("d", "l", "t")


def _valid_path(path) -> bool:
    return isinstance(path, list) and len(path) < 64 and all(
        isinstance(s, list) and len(s) == 2 and (
            (s[0] == "d" and isinstance(s[1], (str, int)) and not isinstance(s[1], bool)) or
            (s[0] in ("l", "t") and isinstance(s[1], int) and not isinstance(s[1], bool)
             and 0 <= s[1] < 2**31)) for s in path)


def _show(path: tuple) -> str:
    return "".join(f"[{key!r}]" for _, key in path) or "the root"


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in ``state`` (the receiver's cap is measured on its own)."""
    return sum(leaf.numel() * leaf.element_size() for _, leaf in flatten(state)
               if isinstance(leaf, torch.Tensor))


# ------------------------------------------------------------------ torchft's transport

class DataOnlyTransport(CheckpointTransport):
    """torchft ``CheckpointTransport`` that sends a state dict as a JSON header and raw tensor
    bytes over ``pg`` (the Manager's cross-replica process group): no pickle, no server.

    own_state: returns this replica's current state dict (torchft's Manager: the whole
    state it sends and loads). Its header caps the size of the peer's header, its tensors the
    bytes the peer may announce (``cap_ratio`` times them, at least ``min_cap_bytes``), and with
    ``same_structure`` (the default) the peer's state must have exactly its form: the same
    entries, each tensor of the same dtype and shape, each value of the same type.

    node_group, node_shared, node_store: this rank's node's process group (its ranks are the
    replica group's ranks, in order), which state paths every rank of a node holds alike, and
    a store every rank of the node reaches (where they agree on a healing); the tensors at
    those paths travel split across the node's ranks (the module's docstring). A node of one
    rank, or no ``node_group``, sends everything whole. Where the state is split, the caller
    opens a round before each of torchft's quorums (:meth:`next_round`, on every rank of the
    node alike) and reports a quorum that failed (:meth:`round_failed`)."""

    def __init__(self, pg, timeout: timedelta, own_state: Callable[[], Any], *,
                 cap_ratio: float = 1.5, min_cap_bytes: int = 1 << 20,
                 same_structure: bool = True, node_group=None,
                 node_shared: Callable[[tuple], bool] | None = None, node_store=None) -> None:
        self._pg, self._timeout, self._own_state = pg, timeout, own_state
        self._cap_ratio, self._min_cap = cap_ratio, min_cap_bytes
        self._same_structure = same_structure
        self._node_group = node_group
        self._slices = None  # (this rank's slice, the node's ranks) where the state is split
        if node_group is not None:
            if node_shared is None:
                raise ValueError("node_group needs node_shared: which state paths every rank "
                                 "of a node holds alike")
            if node_group.size() > 1:
                if node_store is None:
                    raise ValueError("node_group of several ranks needs node_store: where "
                                     "they agree on a healing")
                self._slices = (node_group.rank(), node_group.size())
        self._node_shared = node_shared
        self._node_store = node_store
        self._round = 0
        self._used_round = 0  # the last round a split healing used (round 0 is never opened)
        # (began, ended) wall-clock seconds of each healing this replica received: where a
        # rejoin's time goes (in the quorum at the first's start, healed at its end)
        self.healings: list[tuple[float, float]] = []

    def next_round(self) -> None:
        """A new quorum begins (every rank of the node calls this alike, once per quorum)."""
        self._round += 1

    def round_failed(self) -> None:
        """This rank's quorum failed (wherever: the transport or torchft before it): a
        node-mate that waits for this rank's part of the healing fails at once."""
        if self._node_store is not None:
            self._node_store.set(self._key("failed"), b"1")

    def _key(self, what) -> str:
        return f"thinwire/heal/{self._round}/{what}"

    def _split(self, step: int) -> tuple[int, int] | None:
        """(slice, slices) where this step's state travels split, else None. At step 0
        torchft's ``init_sync`` heals rank by rank (local rank j of every replica but rank j's
        primary), so a node's ranks may not all fetch: then each fetches the whole. Past step
        0 a node's ranks share their step (they commit together), so they heal together."""
        return self._slices if step > 0 else None

    def _shared_tensors(self, paths, slices) -> list[bool]:
        return [slices is not None and self._node_shared(path) for path in paths]

    def metadata(self) -> str:
        return "thinwire-state/1"

    def disallow_checkpoint(self) -> None:
        """Sending is synchronous: nothing of the state is read after send_checkpoint."""

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any,
                        timeout: timedelta) -> None:
        leaves = flatten(state_dict)
        slices = self._split(step)
        header, tensors = describe(leaves, step, slices=slices)
        buffers = [torch.tensor([len(header)], dtype=torch.int64),
                   torch.frombuffer(bytearray(header), dtype=torch.uint8)]
        # the Manager's group is gloo (thinwire.ft.per_step.build_manager), whose send takes
        # host memory: a state on the GPU is staged through it once, for every destination
        tensors = [t.detach().cpu() for t in tensors]
        shared = self._shared_tensors(
            [path for path, leaf in leaves if isinstance(leaf, torch.Tensor)], slices)
        whole = [(i, t) for i, (t, s) in enumerate(zip(tensors, shared)) if not s]
        piece = None
        if slices is not None:
            layout = _Layout([t for t, s in zip(tensors, shared) if s], slices[1])
            piece = layout.pack([t for t, s in zip(tensors, shared) if s])[
                layout.slice(slices[0])]
        works = []
        for dst in dst_ranks:
            works.append(self._pg.send([buffers[0]], dst, tag=_LENGTH_TAG))
            works.append(self._pg.send([buffers[1]], dst, tag=_HEADER_TAG))
            if piece is not None:
                works.append(self._pg.send([piece], dst, tag=_SLICE_TAG))
            for i, tensor in whole:
                works.append(self._pg.send([_as_bytes(tensor)], dst, tag=_FIRST_TENSOR_TAG + i))
        for work in works:
            work.wait(timeout)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int,
                        timeout: timedelta) -> Any:
        began = time.time()
        try:
            return self._recv_checkpoint(src_rank, metadata, step, timeout)
        finally:
            self.healings.append((began, time.time()))

    def _recv_checkpoint(self, src_rank: int, metadata: str, step: int,
                         timeout: timedelta) -> Any:
        if metadata != self.metadata():
            raise UnsafeState(f"peer's checkpoint transport is {_short(metadata)}, not "
                              f"{self.metadata()!r}: healing needs thinwire's on every replica")
        deadline = time.monotonic() + timeout.total_seconds()  # one for the whole state

        def left() -> timedelta:
            return timedelta(seconds=max(deadline - time.monotonic(), 0.001))

        slices = self._split(step)
        if slices is None:
            leaves, (tensors, *_) = self._recv(src_rank, step, left, None)
            return _as_state(rebuild(leaves, tensors))
        if self._round == self._used_round:  # the keys of a used round would be read again
            raise ValueError("a split healing needs a round of its own: call next_round() "
                             "before each of torchft's quorums (FaultTolerantStep.begin does, "
                             "given the transport)")
        self._used_round = self._round
        # split: every rank of the node reaches the exchange, whether its part came or not,
        # so that no node-mate waits on it past the timeout
        try:
            got, failure = self._recv(src_rank, step, left, slices), None
        except Exception as error:  # noqa: BLE001 - raised below, after the node agreed
            got, failure = None, error
        leaves, tensors = self._exchange(got, failure, slices, left)
        return _as_state(rebuild(leaves, tensors))

    def _recv(self, src_rank: int, step: int, left, slices):
        """The header's checked leaves and, in header order, the tensors (the node-shared
        ones: None, but for the ``_Layout`` buffer whose slice of this rank arrived)."""
        own = self._own_state()
        own_header, _ = describe(flatten(own), step, with_tensors=False)
        length = torch.zeros(1, dtype=torch.int64)
        self._pg.recv([length], src_rank, tag=_LENGTH_TAG).wait(left())
        size, most = int(length[0]), min(2 * len(own_header) + (64 << 10), MAX_HEADER_BYTES)
        if not 0 < size <= most:
            raise UnsafeState(f"peer state header of {size} bytes (this replica's is "
                              f"{len(own_header)}: at most {most})")
        header = torch.empty(size, dtype=torch.uint8)
        self._pg.recv([header], src_rank, tag=_HEADER_TAG).wait(left())
        cap = max(int(self._cap_ratio * state_bytes(own)), self._min_cap)
        leaves = parse_header(header.numpy().tobytes(), step, cap, slices)
        if self._same_structure:
            check_structure(leaves, json.loads(own_header)["leaves"])
        entries = [e for e in leaves if e["kind"] == "tensor"]
        shared = self._shared_tensors([_path(e) for e in entries], slices)
        layout = _Layout.of_entries([e for e, s in zip(entries, shared) if s],
                                    slices[1] if slices else 1)
        if slices is not None:
            self._pg.recv([layout.buffer[layout.slice(slices[0])]], src_rank,
                          tag=_SLICE_TAG).wait(left())
        tensors = []
        for i, (entry, is_shared) in enumerate(zip(entries, shared)):
            if is_shared:
                tensors.append(None)  # from the layout's buffer, once the node has it all
                continue
            tensor = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
            self._pg.recv([_as_bytes(tensor)], src_rank, tag=_FIRST_TENSOR_TAG + i) \
                .wait(left())
            tensors.append(tensor)
        return leaves, (tensors, layout, shared, entries)

    def _exchange(self, got, failure, slices, left):
        """Every rank of the node: whether its part arrived and a digest of the shared
        entries' layout, through the node's store, then (all arrived, one layout) the slices
        all-gathered; the leaves and every tensor in header order. Raises on every rank where
        one rank failed, here or before it reached the transport."""
        import hashlib

        j, n = slices
        status = "failed"
        if got is not None:
            _, (_, _, shared, entries) = got
            status = "ok " + hashlib.sha256(json.dumps(
                [e for e, s in zip(entries, shared) if s]).encode()).hexdigest()
        self._node_store.set(self._key(j), status.encode())
        statuses = self._statuses(n, left)
        if failure is not None:
            raise failure
        failed = [r for r in range(n) if statuses[r] is None or not statuses[r].startswith("ok")]
        if failed:
            raise UnsafeState(f"healing failed on local rank(s) {failed} of this node: its "
                              "ranks fetch the shared state together")
        if len(set(statuses)) > 1:
            raise UnsafeState("this node's ranks were sent shared state of different layouts")
        leaves, (tensors, layout, shared, _) = got
        mine = layout.buffer[layout.slice(j)].clone()
        self._node_group._allgather_base(layout.buffer, mine).wait()
        unpacked = iter(layout.unpack())
        return leaves, [next(unpacked) if s else t for t, s in zip(tensors, shared)]

    def _statuses(self, n: int, left) -> list[str | None]:
        """Each local rank's status of this round (None: that rank's quorum failed before it
        posted one), once all are posted or one rank's failure is; raises at the deadline."""
        store, keys = self._node_store, [self._key(r) for r in range(n)]
        deadline = time.monotonic() + left().total_seconds()
        while not store.check(keys):
            if store.check([self._key("failed")]):
                return [store.get(k).decode() if store.check([k]) else None for k in keys]
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise TimeoutError(f"healing: local rank(s) {missing} of this node neither "
                                   f"fetched their part nor failed within the timeout")
            time.sleep(_POLL_S)
        return [store.get(k).decode() for k in keys]

    def shutdown(self, wait: bool = True) -> None:
        """Nothing runs in the background."""


class _Layout:
    """The node-shared tensors packed into one byte buffer, each at a multiple of
    ``_ALIGN``, padded to ``slices`` equal slices."""

    def __init__(self, tensors: list[torch.Tensor], slices: int):
        self._forms = [(t.dtype, tuple(t.shape)) for t in tensors]
        self._place(slices)

    @classmethod
    def of_entries(cls, entries: list[dict], slices: int) -> "_Layout":
        layout = cls.__new__(cls)
        layout._forms = [(DTYPES[e["dtype"]], tuple(e["shape"])) for e in entries]
        layout._place(slices)
        return layout

    def _place(self, slices: int) -> None:
        self.offsets, end = [], 0
        for dtype, shape in self._forms:
            self.offsets.append(end)
            end += -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN
        self.slice_bytes = max(-(-end // slices), 1)
        self.buffer = torch.zeros(self.slice_bytes * slices, dtype=torch.uint8)

    def slice(self, j: int) -> slice:
        return slice(j * self.slice_bytes, (j + 1) * self.slice_bytes)

    def pack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        for tensor, offset in zip(tensors, self.offsets):
            flat = tensor.reshape(-1)
            if flat.numel():
                self.buffer[offset:offset + flat.numel() * flat.element_size()] = \
                    flat.view(torch.uint8)
        return self.buffer

    def unpack(self) -> list[torch.Tensor]:
        """The tensors, each its own memory (the optimizer may keep what it loads as it is:
        views of one buffer would tie its state together)."""
        out = []
        for (dtype, shape), offset in zip(self._forms, self.offsets):
            nbytes = math.prod(shape) * dtype.itemsize
            out.append(self.buffer[offset:offset + nbytes].view(dtype).view(shape).clone())
        return out


def _path(entry: dict) -> tuple:
    """A header entry's path as :func:`flatten` gives it."""
    return tuple((kind, key) for kind, key in entry["path"])


def _as_state(state: Any) -> dict:
    if not isinstance(state, dict):
        raise UnsafeState(f"peer state is a {type(state).__name__}, not a dict")
    return state


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's storage as uint8 (a view: receiving into it fills the tensor). A
    zero-element tensor still sends one byte so the message pairs up."""
    flat = tensor.reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.zeros(1, dtype=torch.uint8)
