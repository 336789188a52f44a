"""Where a sparse bucket's time goes on a GPU: each selector, the packing, and one whole
hitopk bucket (world of one), timed with device synchronisation and profiled op by op.
Run on a lent GPU (the `device` tool): `python3 tests/gpu/profile_select.py`."""

import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed as dist

import thinwire
from thinwire import compress, topk

N, DENSITY = 6_553_600, 0.01  # one 25 MiB DDP bucket of fp32
K = int(N * DENSITY)


def timed(fn, repeats=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


x = torch.randn(N, device="cuda")
for method in topk.METHODS:
    print(f"select {method:13s} {timed(lambda: topk.select(x, K, method)):8.3f} ms")
values, indices = topk.exact(x, K)
indices = torch.sort(indices).values
print(f"pack                 {timed(lambda: compress.pack(x[indices], indices, N)):8.3f} ms")

with tempfile.TemporaryDirectory() as store, warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    dist.init_process_group("nccl", init_method=f"file://{store}/s", rank=0, world_size=1)
    for selector in ("mstopk", "exact"):
        state = thinwire.SyncState(thinwire.Topology.shared(ranks_per_node=1), "hitopk",
                                   density=DENSITY, selector=selector)

        def bucket():
            state.reduce(0, x.clone(), (0,))
            state.end_step()
        print(f"hitopk bucket {selector:7s} {timed(bucket):8.3f} ms")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            bucket()  # the last selector's
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
    dist.destroy_process_group()
