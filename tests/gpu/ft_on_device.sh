#!/usr/bin/env bash
# Fault tolerance on a GPU (issue 32) as one call of the `device` tool (~3 min):
#   run(command="bash tests/gpu/ft_on_device.sh", carry=[".whl"], timeout_s=420)
# The GPU machines carry PyTorch with CUDA, not torchft: .whl (ignored by git, see
# .git/info/exclude) holds torchft 0.2.0's cp312 wheel and its OpenTelemetry needs, fetched here
# with `pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl`.
# Runs the fault-tolerance tests with their GPU cases (model, gradients, optimizer and residuals
# on the GPU; healing staged through host memory), then a short CUDA training per algorithm
# (the hook path after the collectives learned the fault-tolerant groups).
set -u
OUT=${OUT:-/tmp/thinwire-gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, torchft; print('torch', torch.__version__, torch.cuda.get_device_name(), 'torchft', torchft.__file__)"
echo "== fault-tolerance tests, GPU cases included"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_state_transfer.py \
    tests/unit/test_ft_per_step_pieces.py tests/distributed/test_ft_per_step.py \
    tests/unit/test_algorithms_on_device.py 2>&1 | tee "$OUT/pytest_ft.log" | tail -40
for algorithm in allreduce hitopk; do
    echo "== train, $algorithm, CUDA"
    timeout 90 torchrun --nproc_per_node 1 -m thinwire.train --model transformer --device cuda \
        --max-iters 40 --algorithm "$algorithm" --summary "$OUT/train_$algorithm.json" \
        --log-every 20 > "$OUT/train_$algorithm.log" 2>&1; tail -5 "$OUT/train_$algorithm.log"
done
