"""A distributed sampler whose per-node set of samples stays fixed across epochs.

`torch.utils.data.DistributedSampler(shuffle=True)` deals each rank a different random slice of
the whole data set every epoch, so a node's static cache hits at cache / data set at most, however
many nodes share the work. CoorDL's partitioned caching keeps
each node on its own partition: every epoch shuffles the node's partition (not the data set) and
deals it to the node's ranks, so a node's cache that holds its whole partition hits every time.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.utils.data


class NodePartitionSampler(torch.utils.data.Sampler):
    """Indices `i` with `i % num_nodes == node`, shuffled per epoch, dealt to the node's ranks.

    Every rank yields the same number of indices (the partition is padded by wrapping around,
    as DistributedSampler pads), so collective steps stay in lock-step.
    """

    def __init__(self, dataset_len: int, node: int, num_nodes: int, local_rank: int = 0,
                 ranks_per_node: int = 1, shuffle: bool = True, seed: int = 0) -> None:
        if dataset_len < num_nodes * ranks_per_node:
            raise ValueError(f"dataset_len must be >= num_nodes * ranks_per_node "
                             f"({num_nodes * ranks_per_node}), got {dataset_len}")
        if not 0 <= node < num_nodes:
            raise ValueError(f"node must be in [0, {num_nodes}), got {node}")
        if not 0 <= local_rank < ranks_per_node:
            raise ValueError(f"local_rank must be in [0, {ranks_per_node}), got {local_rank}")
        self.dataset_len, self.node, self.num_nodes = dataset_len, node, num_nodes
        self.local_rank, self.ranks_per_node = local_rank, ranks_per_node
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        largest = -(-dataset_len // num_nodes)
        self.per_rank = -(-largest // ranks_per_node)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self) -> Iterator[int]:
        partition = torch.arange(self.node, self.dataset_len, self.num_nodes)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            partition = partition[torch.randperm(len(partition), generator=generator)]
        total = self.per_rank * self.ranks_per_node
        if total > len(partition):
            partition = partition.repeat(-(-total // len(partition)))[:total]
        return iter(partition[self.local_rank:total:self.ranks_per_node].tolist())
