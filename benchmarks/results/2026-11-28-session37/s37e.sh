#!/usr/bin/env bash
# Is 3.7.1's share-plan miscount (s37c) ptxas's? The plan of 24 x 16384 x 1 at 128 heads built under Triton 3.7.1 with
# the image's Triton's ptxas (CUDA 12.8, as in s37a-d) and with the CUDA toolkit's own (13.0); WORK_STATE[0] should be
# 132. Carry ["build/triton37"].
set -uo pipefail
source benchmarks/experiments/with_packed_triton.sh build/triton37
probe='
import sys, torch
from mlakit.kernels import decode_split_plan, triton_decode
decode_split_plan.SHARE_PLAN_TRITONS = ("",)
lengths = torch.full((24,), 16384, dtype=torch.int32, device="cuda")
plan = triton_decode.plan_decode(lengths, q_len=1, heads=128, kv_dtype=torch.bfloat16, num_sms=132, page_size=64)
print(sys.argv[1], "work_state", plan.work_state.tolist())
'
for ptxas in $TRITON_PTXAS_PATH $(ls /usr/local/cuda*/bin/ptxas 2>/dev/null | head -1); do
  $ptxas --version | tail -1
  TRITON_PTXAS_PATH=$ptxas TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PACKED_TRITON:src python -c "$probe" "3.7.1 $ptxas"
done
TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python -c "$probe" "3.6.0 (control)"
