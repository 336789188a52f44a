"""The pipeline engine running the ``ticktock`` schedule (model-parallel Wavelet).

Rank r holds two stage workers: the tick wave's partition r and the tock wave's partition
S-1-r (a second copy of the model, placed in reverse; see ``thinwire.pipeline.ticktock``). Messages go
as in ``thinwire.pipeline.engine`` (non-blocking sends, blocking receives), each wave and
direction on its own tag: the tick's activations flow to rank r+1, the tock's to rank r-1.

The update ``("U", g)`` makes the two copies of every partition one data-parallel model: rank r
exchanges its tick partition's and its tock partition's gradient sums with its partner S-1-r
(which holds the other copy of both) and adds what it receives. Each copy's exchange is posted
(``isend``/``irecv``) as soon as that copy's last backward of the group is done, so it crosses
the wire while the rank still computes the other wave's backwards; the update waits for it. Both sides then hold ``a + b`` and
``b + a`` (floating-point addition is commutative, so the same bits), divide by the group's M
micro-batches and take the same momentum step: the copies stay bitwise equal without ever
sending weights, and the update is gpipe's over the same M micro-batches up to the summation
order (tested against a float64 single-process reference).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from thinwire.peer_failure import noting
from thinwire.pipeline import stage_io
from thinwire.pipeline import ticktock as tt
from thinwire.pipeline.config import DTYPES, PipelineConfig, Stream, build_stages, optimizer_args
from thinwire.pipeline.stage import StageWorker

log = logging.getLogger(__name__)
# The engine's tags are 1 (activations), 2 (gradients), 3 (evaluation); the tick wave uses 1, 2.
TAGS = {(tt.TICK, "F"): 1, (tt.TICK, "B"): 2, (tt.TOCK, "F"): 11, (tt.TOCK, "B"): 12}
TAG_EXCHANGE = 20  # + the partition: each copy's gradient sum on its own tag


def train_stage(cfg: PipelineConfig, ds) -> dict:
    """This rank's part of a ``ticktock`` run (the engine's ``train_stage`` contract: the same
    summary keys; ``params`` are the tick partition's, ``tock_params`` the tock copy's)."""
    cfg.validate()
    r, S = stage_io.init(cfg)
    dtype = DTYPES[cfg.dtype]
    stream = Stream(cfg, len(ds))
    stages = build_stages(cfg, ds.train_x[0].numel(), ds.classes)
    shapes = stage_io.activation_shapes(stages, ds.train_x[:cfg.micro_batch].to(dtype))
    M = cfg.group
    parts = {w: tt.partition_of(r, w, S) for w in (tt.TICK, tt.TOCK)}
    # Two independent copies: the tock's partition starts from the same initial weights.
    workers = {w: StageWorker(stages[p] if w == tt.TICK else _copy(stages[p]),
                              optimizer_args(cfg, p), first=p == 0, last=p == S - 1)
               for w, p in parts.items()}
    ops = tt.build(S, stream.total, M)[r]
    sender = stage_io.Sender()
    exchange = _Exchange(workers, parts, r, S, M)
    events: list[tuple[str, int, float, float]] = []

    first = stream.indices(0)
    for w, p in parts.items():
        stage_io.warm_up(stages[p], cfg, p, S, shapes, ds.train_x[first].to(dtype), ds.train_y[first])
    dist.barrier()
    t_start, cpu_start = time.time(), time.process_time()
    for kind, i in ops:
        with noting(r, stage_io.OP_DOING[kind], i + 1, "micro-batch"):
            if kind == "U":
                tb = time.time()
                exchange.finish_and_update()
                events.append(("U", i, tb, time.time()))
                continue
            w = tt.wave_of(i, M)
            p, worker = parts[w], workers[w]
            if kind == "F":
                if p == 0:
                    x = ds.train_x[stream.indices(i)].to(dtype)
                else:
                    x = torch.empty(shapes[p], dtype=dtype)
                    dist.recv(x, tt.rank_of(p - 1, w, S), tag=TAGS[(w, "F")])
                y = ds.train_y[stream.indices(i)] if p == S - 1 else None
                tb = time.time()
                out = worker.forward(i, x, y)
                events.append(("F", i, tb, time.time()))
                if p < S - 1:
                    sender.send(out, tt.rank_of(p + 1, w, S), TAGS[(w, "F")])
            else:
                if p == S - 1:
                    tb = time.time()
                    g = worker.backward(i)
                else:
                    grad = torch.empty(shapes[p + 1], dtype=dtype)
                    dist.recv(grad, tt.rank_of(p + 1, w, S), tag=TAGS[(w, "B")])
                    tb = time.time()
                    g = worker.backward(i, grad)
                events.append(("B", i, tb, time.time()))
                if p > 0:
                    sender.send(g, tt.rank_of(p - 1, w, S), TAGS[(w, "B")])
                exchange.start_if_done(w)
    sender.wait_all()
    t_end, cpu_s = time.time(), time.process_time() - cpu_start
    log.info("rank %d (tick partition %d, tock partition %d): %d operations in %.2f s", r,
             parts[tt.TICK], parts[tt.TOCK], len(ops), t_end - t_start)

    tick = workers[tt.TICK]
    with noting(r, "evaluating", len(ops), "micro-batch"):
        accuracy = stage_io.evaluate(tick, r, S, ds.test_x.to(dtype), ds.test_y,
                                     tuple(shapes[r][1:]))
    losses = [wk for wk in workers.values() if wk.last and wk.loss_count]
    busy = sum(e[3] - e[2] for e in events)
    return {
        "stage": r, "delay": 0, "t_start": t_start, "t_end": t_end,
        "busy_s": busy, "wall_s": t_end - t_start, "cpu_s": cpu_s, "events": events,
        "samples": stream.total * cfg.micro_batch,
        "train_loss": (sum(wk.loss_sum for wk in losses) / sum(wk.loss_count for wk in losses)
                       if losses else None),
        "test_accuracy": accuracy, "params": [p.detach().clone() for p in tick.opt.params],
        "tock_partition": parts[tt.TOCK],
        "tock_params": [p.detach().clone() for p in workers[tt.TOCK].opt.params],
    }


def _copy(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module)


class _Exchange:
    """The gradient exchange between the two copies of each partition, one per wave."""

    def __init__(self, workers: dict, parts: dict, r: int, S: int, M: int):
        self.workers, self.parts, self.r, self.M = workers, parts, r, M
        self.mate = tt.partner(r, S)
        self.pending: dict[int, tuple] = {}

    def start_if_done(self, wave: int) -> None:
        """Post this copy's exchange once it holds the group's M/2 gradients."""
        opt = self.workers[wave].opt
        if self.mate == self.r or opt.accumulated != self.M // 2 or wave in self.pending:
            return
        mine = torch.cat([g.reshape(-1) for g in opt.grad_sum])
        theirs = torch.empty_like(mine)
        tag = TAG_EXCHANGE + self.parts[wave]
        self.pending[wave] = (dist.isend(mine, self.mate, tag=tag),
                              dist.irecv(theirs, self.mate, tag=tag), mine, theirs)

    def finish_and_update(self) -> None:
        tick, tock = self.workers[tt.TICK].opt, self.workers[tt.TOCK].opt
        for opt in (tick, tock):
            if opt.accumulated != self.M // 2:
                raise RuntimeError(f"rank {self.r}: an update after {opt.accumulated} "
                                   f"micro-batches of a wave, expected M/2 = {self.M // 2} "
                                   f"(schedule broken)")
        if self.mate == self.r:  # the middle of an odd pipeline holds both copies
            for a, b in zip(tick.grad_sum, tock.grad_sum):
                a.add_(b)
                b.copy_(a)
        else:
            for wave, opt in ((tt.TICK, tick), (tt.TOCK, tock)):
                sent, received, _, theirs = self.pending.pop(wave)
                sent.wait()
                received.wait()
                # ours + theirs here, theirs + ours on the partner: the same bits
                _add_flat(opt.grad_sum, theirs)
        for opt in (tick, tock):
            opt.accumulated = self.M
            opt.step()


def _add_flat(grads: list[torch.Tensor], flat: torch.Tensor) -> None:
    at = 0
    for g in grads:
        g.add_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
