"""A fault-tolerant job's process takes torch's compiler import off its way back into the run.

torch imports its compiler (``torch._dynamo``) in every process that trains with a
``torch.optim`` optimizer: ``Optimizer.__init__`` calls ``add_param_group``, which torch marks
"not to be compiled" with ``torch._disable_dynamo``, a wrapper that imports the compiler at its
first call only to build the mark; and every ``step`` imports it again (a graph break). The
import costs about as long as importing torch itself (1-2 s on the emulator's 2-core host), and
a node that rejoins a fault-tolerant run would pay it in its set-up, before it can heal, with
its processes' CPU busy. Here it is paid while the process waits on the network instead:

* :func:`skip_compiler_import` gives the marked optimizer methods a stand-in that calls the
  method directly while ``torch._dynamo`` is absent (until it is imported nothing can be
  compiling, so the mark changes nothing), and builds torch's own mark at its first call once
  the compiler is loaded (from then on the method runs as torch made it);
* :func:`import_compiler_in_background` then imports the compiler on a thread while the main
  thread connects to the job, waits for its quorum and receives its healing (socket waits,
  which release the interpreter's lock); the first ``step`` finds it imported (or waits for the
  import's end under Python's module lock).

Used where thinwire's fault-tolerant job starts (:mod:`thinwire.train.ft_job`, thinwire's
algorithms; a process that builds PyTorch's DDP imports the compiler in DDP's constructor
anyway), never on ``import thinwire``: a user's script keeps torch as torch made it. It relies
on the wrapper's shape in torch 2.13 (a closure over ``fn`` and ``recursive`` that caches its
mark as ``fn.__dynamo_disable``) and leaves a method whose wrapper has another shape alone.
"""

from __future__ import annotations

import sys
import threading

CACHE_ATTRIBUTE = "__dynamo_disable"  # where torch's wrapper caches its mark, on ``fn``
# set while this module's thread imports the compiler: the module is in sys.modules but not
# ready, and nothing compiles with it (the stand-ins call the method without waiting for it)
IMPORTING = threading.Event()
METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def wrapped_function(method) -> tuple | None:
    """(fn, recursive) of a ``torch._disable_dynamo`` wrapper, or None where ``method`` is not
    one of the shape this module knows."""
    code = getattr(method, "__code__", None)
    if code is None or not code.co_filename.replace("\\", "/").endswith("torch/_compile.py"):
        return None
    cells = dict(zip(code.co_freevars, method.__closure__ or ()))
    if set(cells) != {"fn", "recursive"} or CACHE_ATTRIBUTE not in code.co_consts:
        return None
    return cells["fn"].cell_contents, cells["recursive"].cell_contents


def _stand_in(fn, recursive: bool):
    def call(*args, **kwargs):
        if "torch._dynamo" in sys.modules and not IMPORTING.is_set():
            import torch._dynamo  # loaded by someone: from now on torch's own mark

            marked = torch._dynamo.disable(fn, recursive, wrapping=False)
            setattr(fn, CACHE_ATTRIBUTE, marked)
            return marked(*args, **kwargs)
        return fn(*args, **kwargs)

    call.thinwire_stand_in = True
    return call


def skip_compiler_import() -> list[str]:
    """Give ``torch.optim.Optimizer``'s marked methods the stand-in (where torch has not built
    its mark yet); returns the names of the methods whose wrapper has the known shape."""
    import torch

    applied = []
    for name in METHODS:
        found = wrapped_function(getattr(torch.optim.Optimizer, name, None))
        if found is None:
            continue
        fn, recursive = found
        if getattr(fn, CACHE_ATTRIBUTE, None) is None:
            setattr(fn, CACHE_ATTRIBUTE, _stand_in(fn, recursive))
        applied.append(name)
    return applied


def _import_compiler() -> None:
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # the main thread's own import (the first step's) raises it
        pass
    finally:
        IMPORTING.clear()


def import_compiler_in_background() -> threading.Thread | None:
    """Start importing ``torch._dynamo`` on a daemon thread; None where it is imported."""
    if "torch._dynamo" in sys.modules:
        return None
    IMPORTING.set()
    thread = threading.Thread(target=_import_compiler, name="thinwire-compiler-import",
                              daemon=True)
    thread.start()
    return thread
