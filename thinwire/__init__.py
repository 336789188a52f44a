"""thinwire: distributed training for clusters whose network is the bottleneck.

    import thinwire
    state = thinwire.ddp.register(ddp_model, algorithm="hitopk", density=0.01)
"""

from thinwire import ddp, topk
from thinwire.state import SyncState
from thinwire.sync import synchronize
from thinwire.topology import Topology

__version__ = "0.1.0"
__all__ = ["SyncState", "Topology", "ddp", "synchronize", "topk", "__version__"]
