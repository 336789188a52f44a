"""A lost peer, said in one line.

When a rank of a run dies or freezes, every other rank's next collective fails: gloo with a
multi-line ``RuntimeError`` ("Connection reset by peer. This is typically caused by ...",
"Timed out waiting 10000ms for recv"), wrapped by DDP's C++ side, followed by the hook
thread's stack; dlcp's transport with a ``TimeoutError``. Shown raw, that is a 60-line
traceback on every survivor that does not say what the user needs: which rank, doing what,
at which step, and why. The pieces are there, in the notes added on the way up:

* :func:`where_note` (added by ``SyncState.timer``): the algorithm, phase, bucket and step;
* :func:`step_note` (added by a training loop): the rank, the step and what it was doing.

:func:`describe` reads them back from the exception (its chain, its notes, and the message
text, which is all that crosses DDP's C++ layer) and returns the line, or None when the
exception is not a lost peer (a bug must keep its traceback).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

_WHERE = re.compile(r"thinwire (?P<algorithm>\S+): failed in the (?P<phase>.+?) phase of "
                    r"bucket (?P<bucket>\d+) at step (?P<step>\d+)")
_STEP = re.compile(r"thinwire: rank (?P<rank>\d+) was (?P<doing>.+?) at "
                   r"(?P<unit>step|micro-batch) (?P<step>\d+)")

# What gloo, the store and sockets say when the other end is gone or silent. A message with
# none of them (a shape mismatch, a NaN) is not a lost peer, whatever its type.
_LOST_PEER = re.compile(
    r"connection (reset|closed|refused)|broken pipe|timed out|timeout|socket closed|"
    r"no route to host|network is unreachable|pair closure|peer.*(gone|closed|died)|"
    r"end of file|\bEOF\b", re.IGNORECASE)
_GRPC_STATUS = re.compile(r'status: (?P<status>\w+), message: "(?P<message>[^"]*)"')
_SOURCE = re.compile(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*")
_WRAPPER = re.compile(r"^(Got the following error when running the callback: )?"
                      r"((Runtime|Timeout|Value|Connection\w*|OS|Dist\w*)Error: )?")


def where_note(algorithm: str, phase: str, bucket: int, step: int) -> str:
    """The note ``SyncState.timer`` adds to an exception raised inside a phase."""
    return f"thinwire {algorithm}: failed in the {phase} phase of bucket {bucket} at step {step}"


def step_note(rank: int, doing: str, step: int, unit: str = "step") -> str:
    """The note a training loop adds to an exception raised while it was ``doing`` (e.g.
    "in a training step", "evaluating") at ``step`` (counted from 1; ``unit`` "micro-batch"
    for a pipeline's operations)."""
    return f"thinwire: rank {rank} was {doing} at {unit} {step}"


def _chain(exc: BaseException):
    """The exception and its explicit causes (``raise ... from``). Not the implicit context:
    a bug raised while a timeout was being handled is a bug, not a lost peer."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def _texts(exc: BaseException) -> list[str]:
    texts = []
    for link in _chain(exc):
        texts.append(str(link))
        texts.extend(getattr(link, "__notes__", ()))
    return texts


def is_lost_peer(exc: BaseException) -> bool:
    """True for an error that says a collective's other end is gone or silent."""
    return any(_looks_lost(link) for link in _chain(exc))


def _looks_lost(link: BaseException) -> bool:
    import torch.distributed as dist  # here: the command line imports this module, torch later

    if isinstance(link, (dist.DistNetworkError, dist.DistStoreError, ConnectionError,
                         TimeoutError)):
        return True
    return isinstance(link, (RuntimeError, OSError)) and bool(_LOST_PEER.search(str(link)))


def _reason(exc: BaseException) -> str:
    """The innermost lost-peer cause in a few words: gloo's message without its source
    location, its boilerplate and DDP's wrapper."""
    cause = ([link for link in _chain(exc) if _looks_lost(link)] or [exc])[-1]
    text = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    while True:  # DDP wraps once per callback level: "Got the following error ... Got ..."
        stripped = _WRAPPER.sub("", _SOURCE.sub("", text), count=1)
        if stripped == text:
            break
        text = stripped
    text = text.split(". This is typically")[0].split(" This may indicate")[0]
    grpc = _GRPC_STATUS.search(text)  # torchft's lighthouse/manager: a gRPC status dump
    if grpc:
        text = f"torchft: {grpc['message']} ({grpc['status']})"
    return text.rstrip(". ")[:160]


def describe(exc: BaseException, rank: int | None = None) -> str | None:
    """One line for a lost peer (rank, what it was doing, step, phase and bucket where a
    thinwire collective knew them, the reason), or None for any other error."""
    if not is_lost_peer(exc):
        return None
    texts = "\n".join(_texts(exc))
    where, step = _WHERE.search(texts), _STEP.search(texts)
    rank = int(step["rank"]) if step else rank
    who = f"rank {rank}" if rank is not None else "this rank"
    if where:
        place = (f"in the {where['phase']} phase of bucket {where['bucket']} of "
                 f"{where['algorithm']}")
        at = int(step["step"]) if step else int(where["step"]) + 1
    elif step:
        place, at = step["doing"], int(step["step"])
    else:
        place, at = "in a collective", None
    unit = step["unit"] if step else "step"
    when = f" at {unit} {at}" if at is not None else ""
    return f"{who} lost a peer {place}{when}: {_reason(exc)}"


@contextmanager
def noting(rank: int, doing: str, step: int, unit: str = "step"):
    """Adds :func:`step_note` to any exception raised in the block (and re-raises it)."""
    try:
        yield
    except Exception as exc:
        exc.add_note(step_note(rank, doing, step, unit))
        raise
