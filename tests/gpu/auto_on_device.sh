#!/usr/bin/env bash
# The CUDA checks after issue 31's pilot, as one call of the `device` tool (~1 min):
#   run(command="bash tests/gpu/auto_on_device.sh", timeout_s=420)
# on_device.sh's tests (the hook on side streams, every algorithm and selector against the CPU,
# the meta device, the pilot's switches and flushes on the device) and the hook's cost a step,
# without its training runs.
exec bash "$(dirname "$0")/on_device.sh" --tests-and-hook
