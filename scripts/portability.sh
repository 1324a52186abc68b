#!/usr/bin/env bash
# The bit-level tests (pytest marker `bitlevel`: docs/reproducibility.md's bit-for-bit promises) under every CPU
# capability this machine offers (ATEN_CPU_CAPABILITY: default, plus avx2 and avx512 where the CPU has them; on ARM
# default and the machine's own) and with 1 and 2 intra-op threads (OMP_NUM_THREADS): each promise compares two
# computations made in one environment, so it must hold in each. One line per environment (pytest's summary and the
# seconds), the failures' tail when one fails; exit 1 if any environment failed.
#
#   bash scripts/portability.sh                    # every environment
#   bash scripts/portability.sh -k fastpaths       # extra arguments go to pytest
set -uo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=disabled
caps="default"
if [ -r /proc/cpuinfo ]; then
    grep -qw avx2 /proc/cpuinfo && caps="$caps avx2"
    grep -qw avx512f /proc/cpuinfo && caps="$caps avx512"
fi
[ "$caps" = "default" ] && caps="default own"  # not x86-64 (or no /proc): ATen's DEFAULT kernels and the machine's own
model=$( (grep -m1 -i "model name" /proc/cpuinfo 2>/dev/null || uname -m) | sed 's/.*: //')
echo "portability: $model; capabilities: $caps; threads: 1 2"
status=0
start=$SECONDS
for cap in $caps; do
    for threads in 1 2; do
        t=$SECONDS
        if [ "$cap" = own ]; then setting=(env -u ATEN_CPU_CAPABILITY); else setting=(env ATEN_CPU_CAPABILITY="$cap"); fi
        # one pytest process per environment (the capability is read at torch's first kernel); no xdist workers, so
        # the threads are the test's own
        out=$("${setting[@]}" OMP_NUM_THREADS="$threads" python -m pytest -q -m bitlevel -n 0 -p no:randomly \
            -p no:cacheprovider "$@" 2>&1)
        rc=$?
        echo "ATEN_CPU_CAPABILITY=$cap OMP_NUM_THREADS=$threads: $(echo "$out" | tail -n 1) ($((SECONDS - t)) s)"
        if [ $rc -ne 0 ]; then
            echo "$out" | grep -E "^(FAILED|ERROR)" | head -n 20
            status=1
        fi
    done
done
echo "portability: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $status
