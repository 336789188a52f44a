"""The one list of gradient-synchronisation algorithms.

Each algorithm file in this package declares itself once, at import::

    ALGORITHM = register(Algorithm(name="hitopk", reduce=reduce, cost=cost, sparse=True,
                                   summary="..."))

and every list of names in the package (``thinwire train --algorithm`` choices, checkpoint
identity, ``thinwire compare``, the simulator, ``bench sync``) is read from here at the time it
is needed, so a new file (or a user's own :func:`register` call) is reachable everywhere
without other edits.

* ``reduce(state, bucket_index, flat) -> averaged flat``: the collective, run by every rank on
  one bucket (a flat gradient); records its traffic and timings on ``state``
  (:class:`thinwire.state.SyncState`).
* ``cost(cfg, cluster, net, elements, rates) -> BucketCost``: the alpha-beta model of the same
  bucket for the simulator (:mod:`thinwire.collectives.costs` has the building blocks).
* ``sparse``: the algorithm selects top-k and keeps error feedback (density, selector,
  momentum correction and dense warm-up apply to it).
* ``sparse_wire``: the algorithm sends its own top-k selection through the shared
  ``primitives.select_for_wire`` (or rounds it with ``compress.to_sparse_wire`` and hands the
  rounded values to ``feedback.keep``), so ``SyncState(sparse_wire="fp16"|"bf16")`` applies.
* ``options``: the algorithm's own settings, declared once as
  :class:`thinwire.options.Option` (name, type, range, default, help). ``SyncState``, the
  simulator's ``AlgorithmConfig``, the checkpoint identity and every command's
  ``--algorithm-option ALGORITHM:NAME=VALUE`` read them from here; a name the algorithm does
  not declare is refused. ``fill(options) -> options`` (optional) turns a checked
  automatic value into the one the run will use (dlcp: the emulated link's rate).
* ``residual_space``: where a sparse algorithm's error-feedback residual of a bucket lives, so
  that :func:`thinwire.sync.flush_residuals` can hand it back as gradient: ``"bucket"`` (the
  default: this rank's whole bucket, in canonical order) or ``"node_shard"`` (hitopk: this
  local rank's 1/ranks_per_node slice of the node's summed, zero-padded bucket).
* ``paced_datagrams``: its transport sends datagrams paced at the link's nominal rate, not
  TCP (dlcp). The cost model then charges its bytes at the nominal rate, not at the TCP
  goodput/nominal ratio it fits for the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from thinwire.options import Option, check_options, unknown_option

# Below this size a bucket is latency-bound: the sparse algorithms all-reduce it densely.
DEFAULT_DENSE_BELOW_BYTES = 64 * 1024
RESIDUAL_SPACES = ("bucket", "node_shard")


@dataclass(frozen=True)
class Algorithm:
    name: str
    reduce: Callable[..., Any]
    cost: Callable[..., Any]
    sparse: bool = False
    summary: str = ""
    options: tuple[Option, ...] = ()
    sparse_wire: bool = False
    fill: Callable[[dict], dict] | None = None
    residual_space: str = "bucket"
    paced_datagrams: bool = False

    def __post_init__(self):
        if self.residual_space not in RESIDUAL_SPACES:
            raise ValueError(f"Algorithm {self.name!r}: residual_space must be one of "
                             f"{', '.join(RESIDUAL_SPACES)}, got {self.residual_space!r}")
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"algorithm name must be a Python identifier (it is also a "
                             f"command-line choice and a checkpoint key), got {self.name!r}")
        if not (isinstance(self.options, tuple)
                and all(isinstance(o, Option) for o in self.options)):
            raise TypeError(f"Algorithm {self.name!r}: options must be a tuple of "
                            f"thinwire.options.Option, got {self.options!r}")
        for attribute in ("reduce", "cost"):
            if not callable(getattr(self, attribute)):
                raise TypeError(f"Algorithm {self.name!r}: {attribute} must be callable, got "
                                f"{getattr(self, attribute)!r}")

    def check_options(self, options: dict | None) -> dict:
        """The algorithm's own settings, checked against its declarations, defaults filled."""
        checked = check_options(f"algorithm {self.name!r}", self.options, options)
        return self.fill(checked) if self.fill is not None else checked

    def option(self, name: str) -> Option:
        """The declaration of the setting ``name``; a clear error where there is none."""
        for option in self.options:
            if option.name == name:
                return option
        raise unknown_option(f"algorithm {self.name!r}", self.options, [name])


_ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Add ``algorithm`` to the registry (its file calls this once, at import)."""
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"register() takes an Algorithm, got {type(algorithm).__name__}")
    if algorithm.name in _ALGORITHMS and not replace:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def unregister(name: str) -> None:
    """Remove ``name`` (tests that register their own algorithm clean up with this)."""
    _ALGORITHMS.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered name, the dense algorithms first, each kind in registration order."""
    return tuple(sorted(_ALGORITHMS, key=lambda name: _ALGORITHMS[name].sparse))


def sparse_names() -> tuple[str, ...]:
    return tuple(name for name, algorithm in _ALGORITHMS.items() if algorithm.sparse)


def sparse_wire_names() -> tuple[str, ...]:
    """The algorithms whose selected values may travel in fp16/bf16 (``sparse_wire``)."""
    return tuple(name for name, algorithm in _ALGORITHMS.items() if algorithm.sparse_wire)


def is_sparse(name: str) -> bool:
    return get(name).sparse


def get(name: str, param: str = "algorithm") -> Algorithm:
    """The algorithm called ``name``; a clear error naming ``param`` where there is none."""
    algorithm = _ALGORITHMS.get(name) if isinstance(name, str) else None
    if algorithm is None:
        raise ValueError(f"{param} must be one of {', '.join(names())}, got {name!r}")
    return algorithm
