#!/usr/bin/env bash
# Where test_equal_share_plans_at_128_heads[bf16-lengths2-1-132] goes wrong under Triton 3.7.1 (s37b): diag37.py under
# 3.6 and 3.7 in separate processes, the combine with and without programmatic dependent launch, and 3.7 running the
# plan 3.6 built (and the reverse). Carry ["build/triton37"].
set -uo pipefail
R=$OUT/s37c
mkdir -p $R /tmp/t37
[ -f /tmp/t37/triton/_C/libtriton.so ] || { tar -xJf build/triton37/package.tar.xz -C /tmp/t37 &&
  xz -dc build/triton37/libtriton.so.xz > /tmp/t37/triton/_C/libtriton.so; }
export TRITON_BACKENDS_IN_TREE=1
export TRITON_PTXAS_PATH=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas
D=benchmarks/results/2026-11-28-session37/diag37.py
run() { local path=$1; shift; PYTHONPATH=$path timeout 120 python $D $R "$@" 2>&1 | grep -v Warn | tail -4; }
echo "== 3.6 default"; run src default
echo "== 3.7 default"; run /tmp/t37:src default
echo "== 3.7 no-pdl"; run /tmp/t37:src no-pdl
echo "== 3.7 with 3.6's plan"; run /tmp/t37:src plan-from $R/plan-default-3.6.0.pt
echo "== 3.6 with 3.7's plan"; run src plan-from $R/plan-default-3.7.1.pt
echo "== 3.7 default, CUDA_LAUNCH_BLOCKING"; CUDA_LAUNCH_BLOCKING=1 run /tmp/t37:src default
