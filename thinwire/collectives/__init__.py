"""How gradients travel: one file per algorithm, each declaring itself in the registry.

Every algorithm returns the average of ``flat`` over all ranks (exactly for the dense ones, up to
what top-k keeps back for the sparse ones) and records its traffic and timings on ``state``.
Importing this package imports every module in it, so a new algorithm file registers itself
(see :mod:`thinwire.collectives.registry`); no list of names needs editing anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil

from thinwire.collectives import registry
from thinwire.collectives.registry import (Algorithm, get, names, register, sparse_names,
                                           sparse_wire_names)

_SUPPORT = {"registry", "primitives", "traffic", "costs"}  # helpers, not algorithms

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _SUPPORT:
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["Algorithm", "get", "names", "register", "registry", "sparse_names",
           "sparse_wire_names"]
