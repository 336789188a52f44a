"""Multi-level data cache: memory (L1), local disk (L2), remote store through fsspec (L3).

`CachedDataset` is the entry point; see docs/design.md, "Data cache".
"""

from thinwire.data.cached import CachedDataset, PrefetchSampler
from thinwire.data.remote import Objects, RemoteReadError, RemoteStore, Shards
from thinwire.data.sampler import NodePartitionSampler
from thinwire.data.stats import CacheStats
from thinwire.data.tiers import DiskFullWarning, DiskUnwritableWarning

__all__ = ["CachedDataset", "PrefetchSampler", "Objects", "Shards", "RemoteStore",
           "RemoteReadError", "NodePartitionSampler", "CacheStats", "DiskFullWarning",
           "DiskUnwritableWarning"]
