#!/bin/bash
# Fourth GPU session's device call (issue 39's personal-evaluation rows at a quiet load, the host-row stream's
# copy/compute overlap, the convolutions' two forms at cohorts 50-1,000). Run from the repo root with $OUT set.
set -u
export PYTHONPATH=$PWD WANDB_MODE=disabled PYTHONUNBUFFERED=1 QUIET_WAIT=40
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/nvidia_smi.txt
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a $OUT/nvidia_smi.txt
echo "start $(cat /proc/loadavg)" | tee $OUT/load.txt
mkdir -p $OUT/suite
timeout 230 python3 benchmarks/gpu_suite.py --device cuda --sections correctness,personal_eval --budget-s 210 --out $OUT/suite 2>&1 | tee $OUT/suite/log.txt | grep -v "^\s*$" | tail -25
echo "after suite $(cat /proc/loadavg)" | tee -a $OUT/load.txt
timeout 90 python3 benchmarks/host_stream_profile.py --device cuda --clients 10000 --out $OUT/host_stream.json 2>&1 | grep -v "profiler\|^ERROR\|^WARNING\|USDT" | tail -4
echo "after profile $(cat /proc/loadavg)" | tee -a $OUT/load.txt
timeout 150 python3 benchmarks/conv_forms.py --device cuda --clients 50 200 1000 --image-size 32 --batch 10 --steps 5 --repeats 3 2>&1 | tee $OUT/conv_forms.txt | tail -16
echo "end $(cat /proc/loadavg)" | tee -a $OUT/load.txt
