"""Where a process sits in a tick-tock job, and the per-iteration handshake that keeps the offset.

Layout: every device slot of a node runs ``waves`` (2) training processes, launched as
consecutive local ranks by torchrun (`thinwire cluster run --ranks-per-node 2*slots`): local
rank ``2*slot`` is the tick wave, ``2*slot + 1`` the tock wave of that slot. All processes are
ranks of one data-parallel job, so the gradient synchronisation (any registry algorithm) treats
the two waves of a node as two ranks of that node: a hierarchical algorithm sums them on the
node's fast link and sends the node's sum once over the thin wire.

The offset: the tock wave's forward of iteration i starts only after the tick wave's forward of
iteration i has ended. The tick sends its iteration number to its tock on a two-rank gloo group
after every forward (`isend`, never blocking the tick); the tock receives it before every
forward. Both waves meet again in the gradient synchronisation, where the tick waits (its
memory valley: activations freed, only weights and gradients held) while the tock finishes its
backward; after the update the tick runs ahead again by one forward.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import time

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

WAVES_ALLOWED = (1, 2)
WAVE_NAMES = ("tick", "tock")
# When the tock may start its forward: when the tick's forward has ended (the paper's offset,
# for devices that run the two waves' kernels side by side), or when the tick's backward
# compute has ended (its activations are freed: the peaks never meet; on CPU nodes, where the
# two waves share the cores and compute one after the other anyway, this costs no time).
TURNS = ("forward", "backward")


def check_turn(turn, param: str = "turn") -> str:
    if turn not in TURNS:
        raise ValueError(f"{param} must be one of {', '.join(TURNS)} (when the tock wave's "
                         f"forward may start: after the tick's forward or after its backward), "
                         f"got {turn!r}")
    return turn


def check_waves(waves, param: str = "--waves") -> int:
    if isinstance(waves, bool) or not isinstance(waves, int) or waves not in WAVES_ALLOWED:
        raise ValueError(f"{param} must be 1 (plain data parallel) or 2 (tick-tock: a tick and a "
                         f"tock wave per device slot); only two waves are supported, got "
                         f"{waves!r}")
    return waves


# Options of `thinwire train` the wave loop does not implement; refused rather than ignored.
# (The wave loop evaluates once, after training: --eval-every's steps are not its.)
UNSUPPORTED = {"checkpoint": None, "resume": None, "stop_after": 0, "checkpoint_every": 0,
               "metrics": None, "amp": "none", "stop_at_target": False, "budget_s": 0.0,
               "eval_every": 0}


def check_train_config(cfg) -> None:
    """A `thinwire train` configuration (TrainConfig) with ``waves == 2``: what the wave loop
    can run, refused by option name otherwise."""
    check_waves(cfg.waves)
    check_turn(cfg.wave_turn, "--wave-turn")
    from thinwire.train import modes

    if not modes.mode_of(cfg.algorithm).per_step:
        raise ValueError(f"--algorithm {cfg.algorithm} is not supported with --waves 2 "
                         f"(allowed: a per-step algorithm, one of "
                         f"{', '.join(modes.PER_STEP.algorithms())}; the two waves are one "
                         f"data-parallel job)")
    for name, default in UNSUPPORTED.items():
        if getattr(cfg, name) != default:
            raise ValueError(f"--{name.replace('_', '-')} is not supported with --waves 2 "
                             f"(allowed: its default, {default!r}), got {getattr(cfg, name)!r}")


class WaveDied(RuntimeError):
    """The other wave of this device slot ended (crashed, killed) in the middle of the run."""


class Wave:
    """This process's place: rank, node, device slot, wave index and the other wave's rank."""

    def __init__(self, rank: int, world: int, local_rank: int, local_world: int, waves: int = 2):
        check_waves(waves)
        if local_world % waves:
            raise ValueError(f"--waves {waves} needs {waves} processes per device slot: the "
                             f"processes per node (--ranks-per-node / LOCAL_WORLD_SIZE) must be a "
                             f"multiple of {waves}, got {local_world}")
        if world % local_world:
            raise ValueError(f"world size {world} is not a multiple of the processes per node "
                             f"{local_world}")
        self.rank, self.world, self.waves = rank, world, waves
        self.local_rank, self.local_world = local_rank, local_world
        self.node = rank // local_world
        self.index = local_rank % waves          # 0: tick, 1: tock
        self.slot = local_rank // waves
        self.slots_per_node = local_world // waves
        first = self.node * local_world + self.slot * waves
        self.slot_ranks = list(range(first, first + waves))

    @classmethod
    def from_env(cls, waves: int = 2) -> "Wave":
        """From torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)."""
        check_waves(waves)
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE",
                                         os.environ.get("THINWIRE_RANKS_PER_NODE", world)))
        local_rank = int(os.environ.get("LOCAL_RANK", rank % local_world))
        return cls(rank, world, local_rank, local_world, waves)

    @property
    def name(self) -> str:
        return WAVE_NAMES[self.index] if self.waves > 1 else "single"

    def describe(self) -> str:
        return f"{self.name} wave (rank {self.rank}, node {self.node}, slot {self.slot})"


class TickTock:
    """The handshake and the event record of one wave. Collective to build (every rank of the
    world calls it: one two-rank group per device slot is created on all ranks, in order).

        tt = TickTock(Wave.from_env(2))
        tt.attach(module)  # the module inside DDP (see attach)
        for step ...:
            with tt.forward(step):
                loss = loss_fn(model(x), y)
            loss.backward(); opt.step()
    """

    def __init__(self, wave: Wave, turn: str = "forward", timeout_s: float = 300.0):
        self.wave, self.turn = wave, check_turn(turn)
        self.backward_done_at: float | None = None  # when the last gradient of a step was made
        self.events: list[dict] = []  # {"step", "kind", "start", "end"} on the wall clock
        self._pending = None
        self._token = torch.zeros(1, dtype=torch.int64)
        self._group = None
        self._attached, self._step, self._waited, self._turn = False, None, False, None
        self._sent_for = None
        if wave.waves > 1:
            timeout = datetime.timedelta(seconds=timeout_s)
            for node in range(wave.world // wave.local_world):
                for slot in range(wave.slots_per_node):
                    first = node * wave.local_world + slot * wave.waves
                    group = dist.new_group(list(range(first, first + wave.waves)),
                                           timeout=timeout, backend="gloo")
                    if first == wave.slot_ranks[0]:
                        self._group = group

    def record(self, step: int, kind: str, start: float, end: float) -> None:
        self.events.append({"step": step, "kind": kind, "start": start, "end": end})

    def attach(self, module: torch.nn.Module) -> None:
        """Wait for the turn inside ``module``'s forward instead of before it: pass the module
        wrapped by DistributedDataParallel, whose own forward may run a collective first (the
        bucket rebuild after the first step), which both waves must reach."""
        module.register_forward_pre_hook(self._pre_hook)
        self._attached = True
        params = [p for p in module.parameters() if p.requires_grad]
        self._grads_expected, self._grads_seen = len(params), 0
        for param in params:
            param.register_post_accumulate_grad_hook(self._grad_hook)

    def _grad_hook(self, _param) -> None:
        """Counts the gradients of a backward: the last one ends the wave's compute (every
        parameter must get one, as DistributedDataParallel requires anyway)."""
        self._grads_seen += 1
        if self._grads_seen == self._grads_expected:
            self._grads_seen = 0
            self.backward_done_at = time.time()
            if self.turn == "backward" and self._sent_for is not None:
                step, self._sent_for = self._sent_for, None
                self._send(step)

    def _pre_hook(self, module, args):
        if self._step is not None and not self._waited:
            self._wait_turn()

    def _wait_turn(self) -> None:
        self._waited = True
        if self.wave.waves > 1 and self.wave.index == 1:
            waited = time.time()
            self._receive(self._step)
            self._turn = time.time()
            self.record(self._step, "wait", waited, self._turn)

    @contextlib.contextmanager
    def forward(self, step: int):
        """Around the forward pass (model and loss) of iteration ``step``."""
        self._step, self._waited, self._turn = step, False, None
        if not self._attached:
            self._wait_turn()
        start = time.time()
        try:
            yield
        finally:
            if not self._waited:  # the attached module did not run: keep the tokens in step
                self._wait_turn()
            self._step = None
        end = time.time()
        self.record(step, "forward", self._turn or start, end)
        if self.wave.waves > 1 and self.wave.index == 0:
            if self.turn == "forward" or not self._attached:
                self._send(step)
            else:  # sent by the last gradient hook of this step's backward
                self._sent_for = step

    def _send(self, step: int) -> None:
        if self._pending is not None:  # the previous token has long arrived: this never waits
            self._wait(self._pending)
        self._token = torch.tensor([step], dtype=torch.int64)  # a new tensor: isend keeps it
        tock = self.wave.slot_ranks[1]
        try:
            self._pending = dist.isend(self._token, dst=tock, group=self._group)
        except RuntimeError as exc:
            raise self._died(exc) from None

    def _receive(self, step: int) -> None:
        tick = self.wave.slot_ranks[0]
        token = torch.zeros(1, dtype=torch.int64)
        try:
            dist.recv(token, src=tick, group=self._group)
        except RuntimeError as exc:
            raise self._died(exc) from None
        if int(token) != step:
            raise RuntimeError(f"wave handshake out of step: {self.wave.describe()} is at "
                               f"iteration {step}, its tick wave sent {int(token)}")

    def _wait(self, work) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            raise self._died(exc) from None

    def _died(self, exc: Exception) -> WaveDied:
        other = WAVE_NAMES[1 - self.wave.index]
        peer = self.wave.slot_ranks[1 - self.wave.index]
        return WaveDied(f"the {other} wave (rank {peer}) of node {self.wave.node}, slot "
                        f"{self.wave.slot} is gone: the handshake with it failed ({exc}); "
                        f"the run stops")

    def close(self) -> None:
        """Completes the last token (call before destroying the process groups)."""
        if self._sent_for is not None:
            raise RuntimeError(f"{self.wave.describe()}: the backward of iteration "
                               f"{self._sent_for} never produced every gradient, so the tock "
                               f"wave was never given its turn (turn='backward' needs a "
                               f"gradient for every parameter)")
        if self._pending is not None:
            self._wait(self._pending)
            self._pending = None
