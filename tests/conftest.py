"""Suite-wide: pytest puts this folder on sys.path, so every test module can import the helpers
that live here (``procs``)."""

import pytest


@pytest.fixture
def world_of_one(tmp_path, request):
    """torch.distributed as a world of one, destroyed after the test: gloo, or the backend a
    test asks for with ``@pytest.mark.parametrize("world_of_one", ["nccl"], indirect=True)``."""
    import torch.distributed as dist

    backend = getattr(request, "param", "gloo")
    dist.init_process_group(backend, init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield backend
    dist.destroy_process_group()
