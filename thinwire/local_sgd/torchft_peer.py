"""torchft's DiLoCo (PyPI ``torchft``, the optional extra ``thinwire[peers]``) run the way its own
integration tests run it, to compare against thinwire's.

One replica group per node, each with its own TCPStore, torchft Manager (synchronous quorum,
as its DiLoCo requires) and ProcessGroupGloo, all coordinated by one in-process
LighthouseServer. torchft steps from a hook on the inner optimizer: ``inner.step()`` alone
drives the outer synchronisation.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import timedelta

import torch

_INIT_LOCK = threading.Lock()  # replicas are threads: seeding and init share the global RNG
MISSING = ("torchft is not installed (it is the optional extra: pip install -e '.[peers]', "
           "or make install)")


def available() -> bool:
    return importlib.util.find_spec("torchft") is not None


def run_replicas(nodes: int, train_replica, *args, processes: bool = False,
                 timeout_s: float = 120.0) -> list:
    """``train_replica(manager_factory, replica_id, *args)`` for every replica, on threads (as
    torchft's tests do) or, with ``processes=True``, on spawned processes (``train_replica``
    must then be a module-level function); returns their results by replica.
    ``manager_factory(load_state_dict, state_dict)`` builds the replica's Manager."""
    if not available():
        raise RuntimeError(MISSING)
    from torchft.coordination import LighthouseServer

    # loopback only: the replicas are this machine's threads or processes ("[::]" would
    # listen on every network the host has)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=nodes)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    if processes:
        import multiprocessing
        pool = ProcessPoolExecutor(max_workers=nodes,
                                   mp_context=multiprocessing.get_context("spawn"))
    else:
        pool = ThreadPoolExecutor(max_workers=nodes)
    try:
        with pool:
            futures = [pool.submit(_replica, train_replica, i, nodes, address,
                                   timeout_s, args) for i in range(nodes)]
            return [f.result(timeout=timeout_s) for f in futures]
    finally:
        lighthouse.shutdown()


def _replica(train_replica, replica_id, nodes, lighthouse_address, timeout_s, args=()):
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    managers = []

    def make_manager(load_state_dict, state_dict):
        manager = Manager(pg=ProcessGroupGloo(), load_state_dict=load_state_dict,
                          state_dict=state_dict, min_replica_size=nodes, use_async_quorum=False,
                          replica_id=str(replica_id), store_addr="localhost",
                          store_port=store.port, rank=0, world_size=1,
                          lighthouse_addr=lighthouse_address, hostname="localhost",
                          timeout=timedelta(seconds=timeout_s),
                          # identical seeded inits: no weight copy from replica 0 at the first
                          # quorum (which comes after sync_every local steps, so it would
                          # overwrite what replica 1 learnt)
                          init_sync=False)
        managers.append(manager)
        return manager

    try:
        return train_replica(make_manager, replica_id, *args)
    finally:
        for manager in managers:
            manager.shutdown(wait=False)


def diloco_replica(make_model, make_inner, loss_of, steps: int, sync_every: int,
                   outer_lr: float, outer_momentum: float, nesterov: bool = True):
    """A ``train_replica`` for :func:`run_replicas`: torchft DiLoCo (one fragment, no delay) on
    ``make_model()``, node ``replica_id``'s data ``loss_of(model, replica_id, step)``. Returns
    the final parameters and the wall time of each outer step (the inner step that syncs)."""
    from torchft.local_sgd import DiLoCo

    def train(make_manager, replica_id):
        with _INIT_LOCK:
            model = make_model()
        manager = make_manager(lambda s: model.load_state_dict(s["model"]),
                               lambda: {"model": model.state_dict()})
        inner = make_inner(list(model.parameters()))
        outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum,
                                nesterov=nesterov)
        sync_seconds = []
        with DiLoCo(manager, [model], inner, outer, sync_every=sync_every):
            for step in range(steps):
                inner.zero_grad()
                loss_of(model, replica_id, step).backward()
                start = time.perf_counter()
                inner.step()  # torchft's post-step hook runs the outer step every sync_every
                if (step + 1) % sync_every == 0:
                    sync_seconds.append(time.perf_counter() - start)
        return {"params": [p.detach().clone() for p in model.parameters()],
                "sync_s": sync_seconds}

    return train
