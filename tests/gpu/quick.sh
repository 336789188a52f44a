# A short GPU check (one `device` call, ~2 min): the device tests, the selectors by size, the hook.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/thinwire-gpu}; mkdir -p "$OUT"
TW=(python3 -c "from thinwire.cli import main; main()")
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/unit/test_algorithms_on_device.py 2>&1 | tail -3
timeout 120 "${TW[@]}" bench topk --device cuda --sizes 1000000 6553600 26214400 104857600 --densities 0.01 0.001 --methods mstopk mstopk-carry sampled --json "$OUT/topk_cuda.json" 2>&1 | tail -40
timeout 80 "${TW[@]}" bench ddp-hook --device cuda --json "$OUT/ddp_hook_auto.json" 2>&1 | tail -9
