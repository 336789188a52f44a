"""A replica heals from a live peer through torchft's Manager with thinwire's data-only
transport (thinwire.ft.state_transfer) instead of torchft's pickling HTTP one: two replica
groups (threads, as torchft's own tests run them) start from different weights; with
init_sync the second takes the first's at the first quorum, and the bytes crossed as JSON +
raw tensors."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch

pytest.importorskip("torchft")

from torch.distributed import TCPStore  # noqa: E402
from torchft import Manager, ProcessGroupGloo  # noqa: E402
from torchft.coordination import LighthouseServer  # noqa: E402

from thinwire.ft.state_transfer import DataOnlyTransport  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=30)


class CountingTransport(DataOnlyTransport):
    calls: list = []

    def send_checkpoint(self, dst_ranks, step, state_dict, timeout):
        self.calls.append(("send", tuple(dst_ranks), step))
        return super().send_checkpoint(dst_ranks, step, state_dict, timeout)

    def recv_checkpoint(self, src_rank, metadata, step, timeout):
        self.calls.append(("recv", src_rank, step))
        return super().recv_checkpoint(src_rank, metadata, step, timeout)


def test_a_replica_heals_from_its_peer_without_pickle():
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    before, after, errors = {}, {}, []

    def replica(index: int) -> None:
        try:
            torch.manual_seed(index)
            model = torch.nn.Linear(4, 3)
            before[index] = {k: v.clone() for k, v in model.state_dict().items()}
            store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            pg = ProcessGroupGloo(timeout=TIMEOUT)
            built = {}  # the transport measures a peer's state against its Manager's own
            manager = built["manager"] = Manager(
                pg=pg, load_state_dict=lambda s: model.load_state_dict(s["model"]),
                state_dict=lambda: {"model": model.state_dict()}, min_replica_size=2,
                use_async_quorum=False, replica_id=f"node{index}", store_addr="127.0.0.1",
                store_port=store.port, rank=0, world_size=1, lighthouse_addr=address,
                hostname="127.0.0.1", timeout=TIMEOUT, init_sync=True,
                checkpoint_transport=CountingTransport(
                    pg, TIMEOUT, own_state=lambda: built["manager"]._manager_state_dict()))
            try:
                manager.start_quorum()
                assert manager.should_commit()
                after[index] = {k: v.clone() for k, v in model.state_dict().items()}
            finally:
                manager.shutdown(wait=False)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    finally:
        lighthouse.shutdown()
    assert not errors, errors
    assert not torch.equal(before[0]["weight"], before[1]["weight"])
    healed = [i for i in range(2) if not torch.equal(after[i]["weight"], before[i]["weight"])]
    assert len(healed) == 1
    donor = 1 - healed[0]
    for name in before[donor]:
        assert torch.equal(after[healed[0]][name], before[donor][name])
    assert sorted(c[0] for c in CountingTransport.calls) == ["recv", "send"]
