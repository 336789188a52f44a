"""When gradients travel: DiLoCo / local SGD, an outer step every H inner steps across nodes.

See :mod:`thinwire.local_sgd.diloco` for the algorithm and docs/design.md (issue 16) for the
choices (schedule of fragments, overlap, mixing, what the outer exchange sends).
"""

from thinwire.local_sgd.diloco import DiLoCo, node_group

__all__ = ["DiLoCo", "node_group"]
