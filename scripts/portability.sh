#!/usr/bin/env bash
# The bit-level tests (pytest marker `bitlevel`: docs/reproducibility.md's bit-for-bit promises) under every CPU
# capability this machine offers (ATEN_CPU_CAPABILITY: default, plus avx2 and avx512 where the CPU has them; on ARM
# default and the machine's own) and with 1 and 2 intra-op threads (OMP_NUM_THREADS): each promise compares two
# computations made in one environment, so it must hold in each. One line per environment (pytest's summary and the
# seconds), the failures' tail when one fails; exit 1 if any environment failed.
#
#   bash scripts/portability.sh                    # every environment
#   bash scripts/portability.sh --mkl              # and MKL's other code paths (MKL_CBWR=COMPATIBLE, AVX2), 1 and 2 threads
#   bash scripts/portability.sh -k fastpaths       # extra arguments go to pytest
#
# MKL picks its GEMM code path by CPU (vendor and instructions), not by ATEN_CPU_CAPABILITY: MKL_CBWR=COMPATIBLE makes
# this machine take the path a machine of another kind may take (with two threads it splits products of different
# shapes differently, as an Intel Xeon's MKL does: docs/reproducibility.md).
set -uo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=disabled
mkl=""
if [ "${1:-}" = "--mkl" ]; then mkl="COMPATIBLE AVX2"; shift; fi
caps="default"
if [ -r /proc/cpuinfo ]; then
    grep -qw avx2 /proc/cpuinfo && caps="$caps avx2"
    grep -qw avx512f /proc/cpuinfo && caps="$caps avx512"
fi
[ "$caps" = "default" ] && caps="default own"  # not x86-64 (or no /proc): ATen's DEFAULT kernels and the machine's own
model=$( (grep -m1 -i "model name" /proc/cpuinfo 2>/dev/null || uname -m) | sed 's/.*: //')
# only the files that hold bitlevel tests are collected (collecting the whole suite takes longer than running these)
mapfile -t files < <(grep -rl --include="test_*.py" "pytest.mark.bitlevel" tests | sort)
echo "portability: $model; capabilities: $caps; threads: 1 2${mkl:+; MKL_CBWR: $mkl}; ${#files[@]} test files"
status=0
start=$SECONDS
environments=()
for cap in $caps; do for threads in 1 2; do environments+=("$cap $threads -"); done; done
own=${caps##* }  # the machine's own capability (the last listed)
for path in $mkl; do for threads in 1 2; do environments+=("$own $threads $path"); done; done
for environment in "${environments[@]}"; do
    read -r cap threads path <<< "$environment"
    t=$SECONDS
    setting=(env)
    if [ "$cap" = own ]; then setting+=(-u ATEN_CPU_CAPABILITY); else setting+=(ATEN_CPU_CAPABILITY="$cap"); fi
    name="ATEN_CPU_CAPABILITY=$cap OMP_NUM_THREADS=$threads"
    if [ "$path" != - ]; then setting+=(MKL_CBWR="$path"); name="$name MKL_CBWR=$path"; fi
    # one pytest process per environment (the capability is read at torch's first kernel); no xdist workers, so the
    # threads are the test's own
    out=$("${setting[@]}" OMP_NUM_THREADS="$threads" python -m pytest -q -m bitlevel -n 0 -p no:randomly \
        -p no:cacheprovider "${files[@]}" "$@" 2>&1)
    rc=$?
    echo "$name: $(echo "$out" | tail -n 1) ($((SECONDS - t)) s)"
    if [ $rc -ne 0 ]; then
        echo "$out" | grep -E "^(FAILED|ERROR)" | head -n 20
        status=1
    fi
done
echo "portability: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $status
