#!/bin/bash
# Third H100 session's device call (issue 39's GPU row, issue 40's server-step cost): run from the repo root with $OUT set.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 LFED_DATA_DIR=$PWD/.data
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv | tee $OUT/nvidia_smi.txt
uptime | tee $OUT/load.txt
mkdir -p $OUT/personal && timeout 240 python3 benchmarks/gpu_suite.py --sections personal_eval --budget-s 200 --out $OUT/personal 2>&1 | tail -40
uptime | tee -a $OUT/load.txt
timeout 150 python3 benchmarks/async_step.py --accelerator cuda --repeats 3 --steps 25 > $OUT/async_step_cuda.json 2> $OUT/async_step_cuda.err; tail -3 $OUT/async_step_cuda.err; cat $OUT/async_step_cuda.json
timeout 150 python3 benchmarks/async_step.py --accelerator cpu --repeats 3 --steps 25 > $OUT/async_step_cpu.json 2> $OUT/async_step_cpu.err; tail -3 $OUT/async_step_cpu.err; cat $OUT/async_step_cpu.json
uptime | tee -a $OUT/load.txt
