#!/usr/bin/env bash
# The CUDA checks after issue 31's pilot, as one call of the `device` tool (~4 min):
#   run(command="bash tests/gpu/auto_on_device.sh", timeout_s=420)
# The hook's CUDA tests (side streams, no device sync in backward), every algorithm and
# selector on the device against the CPU, the meta device, the pilot's switches and flushes
# on the device (tests/unit/test_pilot_on_device.py), then the hook's cost a step.
set -u
OUT=${OUT:-/tmp/thinwire-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
echo "== tests on CUDA"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_ddp_cuda.py \
    tests/unit/test_algorithms_on_device.py tests/unit/test_meta_device.py \
    tests/unit/test_pilot_on_device.py tests/unit/test_topk.py::test_cuda_contract \
    2>&1 | tee "$OUT/pytest.log" | tail -40
echo "== the hook's cost and overlap"
timeout 150 python3 -c "from thinwire.cli import main; main()" bench ddp-hook --device cuda \
    --json "$OUT/ddp_hook_auto.json" 2>&1 | tail -12
