"""Fault-tolerant per-step training (thinwire.ft.per_step) through a node lost mid-step and
brought back: 2 nodes x 2 ranks, each node its own process group, the nodes joined only by
torchft's Lighthouse (here in the test's process). Node 1 vanishes in the inter-node phase of
step 8 (every rank of it exits); node 0 goes on alone without a restart; node 1 starts again,
heals from node 0 and both finish at the same step.

The reference is the run itself: every committed step applies the same average on every rank
present, and a returning node takes a live peer's model, optimizer and SyncState, so at the end
all four ranks hold bit-identical weights and momentum (float64)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torchft")

from torch.distributed import TCPStore  # noqa: E402
from torchft.coordination import LighthouseServer  # noqa: E402

from thinwire.ports import free_port  # noqa: E402

WORKER = Path(__file__).with_name("ft_per_step_workers.py")
NODES, PER_NODE, STEPS, DIE_AT = 2, 2, 24, 8
DEADLINE_S = 150


def _start_node(node: int, lighthouse: str, job_port: int, algorithm: str, out: Path,
                die_at: int = -1):
    port = free_port()
    logs = [open(out / f"node{node}-rank{local}-{'dies' if die_at >= 0 else 'runs'}.log", "w")
            for local in range(PER_NODE)]
    return [subprocess.Popen(
        [sys.executable, str(WORKER), "--node", str(node), "--local-rank", str(local),
         "--ranks-per-node", str(PER_NODE), "--nodes", str(NODES), "--node-port", str(port),
         "--lighthouse", lighthouse, "--job-store-port", str(job_port), "--algorithm", algorithm, "--steps", str(STEPS),
         "--die-at", str(die_at), "--out", str(out / f"node{node}-rank{local}.json")],
        stdout=logs[local], stderr=subprocess.STDOUT, text=True)
        for local in range(PER_NODE)]


def _tails(procs) -> str:
    return "\n".join(f"== {p.stdout.name}\n" + Path(p.stdout.name).read_text()[-3000:]
                     for p in procs)


def _wait(procs, deadline: float) -> list[int]:
    codes = []
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"a rank hung past the deadline:\n{_tails(procs)}")
        codes.append(proc.returncode)
    return codes


@pytest.mark.parametrize("algorithm", ["hitopk", "topk_allgather"])
def test_a_node_lost_mid_step_and_back_trains_on_to_identical_weights(tmp_path, algorithm):
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000,
                                  heartbeat_timeout_ms=1000)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    job = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # start barrier
    deadline = time.monotonic() + DEADLINE_S
    survivors = dying = returning = []
    try:
        survivors = _start_node(0, address, job.port, algorithm, tmp_path)
        dying = _start_node(1, address, job.port, algorithm, tmp_path, die_at=DIE_AT)
        codes = _wait(dying, deadline)
        assert codes == [17] * PER_NODE, _tails(dying + survivors)
        returning = _start_node(1, address, job.port, algorithm, tmp_path)
        codes = _wait(survivors + returning, deadline)
        assert codes == [0] * (2 * PER_NODE), _tails(survivors + returning)
    finally:
        for proc in survivors + dying + returning:
            if proc.poll() is None:
                proc.kill()
        lighthouse.shutdown()

    results = [json.loads((tmp_path / f"node{n}-rank{r}.json").read_text())
               for n in range(NODES) for r in range(PER_NODE)]
    first = results[0]
    for result in results:
        assert result["step"] == first["step"] >= STEPS
        assert result["params"] == first["params"]  # bit-identical, float64
        assert result["momentum"] == first["momentum"]
        assert result["sync_steps"] == first["sync_steps"]
    for survivor in results[:PER_NODE]:
        counts = [nodes for _, nodes in survivor["quorums"]]
        assert counts[:3] == [2, 1, 2], survivor["quorums"]  # lost node 1, then had it back
        assert survivor["rolled_back"] >= 1  # the step node 1 died in was not committed
    for returned in results[PER_NODE:]:
        # it joined at the survivors' step (healed), not at 0, and trained to the end with them
        assert returned["quorums"][0][0] > DIE_AT and returned["quorums"][0][1] == 2
        assert returned["committed"] < STEPS
