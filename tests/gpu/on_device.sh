#!/usr/bin/env bash
# The GPU checks (issue 30, item 4) as one call of the `device` tool, whose machines carry
# PyTorch with CUDA but not thinwire's virtual environment (thinwire runs from the tree):
#   run(command="bash tests/gpu/on_device.sh", timeout_s=480)
# Writes pytest's log, the hook benchmark's JSON and two training summaries under $OUT.
# With --tests-and-hook it stops after the hook's benchmark (~1 min; tests/gpu/auto_on_device.sh).
set -u
OUT=${OUT:-/tmp/thinwire-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
echo "== tests on CUDA"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_ddp_cuda.py \
    tests/unit/test_algorithms_on_device.py tests/unit/test_meta_device.py \
    tests/unit/test_pilot_on_device.py tests/unit/test_topk.py::test_cuda_contract 2>&1 \
    | tee "$OUT/pytest.log" | tail -60
echo "== the hook's cost and overlap"
timeout 150 python3 -c "from thinwire.cli import main; main()" bench ddp-hook --device cuda \
    --json "$OUT/ddp_hook.json" 2>&1 | tail -20
[ "${1:-}" = "--tests-and-hook" ] && exit 0
for algorithm in allreduce hitopk; do
    echo "== train, $algorithm, CUDA"
    timeout 90 torchrun --nproc_per_node 1 -m thinwire.train --model transformer --device cuda \
        --max-iters 40 --algorithm "$algorithm" --summary "$OUT/train_$algorithm.json" \
        --log-every 20 > "$OUT/train_$algorithm.log" 2>&1; tail -25 "$OUT/train_$algorithm.log"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in \
('algorithm','steps','iter_ms','compute_ms_per_iter','sync_ms_per_iter','final_loss','hook')})" \
        "$OUT/train_$algorithm.json"
done
echo "== where a sparse bucket's time goes"
timeout 120 python3 tests/gpu/profile_select.py 2>&1 | grep -v Warning | tee "$OUT/profile.txt" | head -60
