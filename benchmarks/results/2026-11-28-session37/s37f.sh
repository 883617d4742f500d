#!/usr/bin/env bash
# The 3.7.1 share-plan miscount, probed: the plan of 24 x 16384 x 1 at 128 heads under 3.7.1 and 3.6 from two copies
# of the plan kernel (build/dev/<name>/src, made on the host): "dump" writes each sequence's last_round, first_part
# and piece count into the plan's last 32 (unused) rows; "barrier" adds a tl.debug_barrier() before the item count.
# Carry ["build/triton37", "build/dev"].
set -uo pipefail
source benchmarks/experiments/with_packed_triton.sh build/triton37
probe='
import sys, torch
from mlakit.kernels import decode_split_plan, triton_decode
decode_split_plan.SHARE_PLAN_TRITONS = ("",)
lengths = torch.full((24,), 16384, dtype=torch.int32, device="cuda")
plan = triton_decode.plan_decode(lengths, q_len=1, heads=128, kv_dtype=torch.bfloat16, num_sms=132, page_size=64)
tail = plan.work[-32:-8, :3].tolist()
print(sys.argv[1], "work_state", plan.work_state.tolist(), "rows", plan.work.shape[0])
print("  last_round", [r[0] for r in tail]); print("  first_part", [r[1] for r in tail]); print("  pieces", [r[2] for r in tail])
'
for v in dump barrier; do
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PACKED_TRITON:build/dev/$v/src python -c "$probe" "3.7.1 $v" 2>&1 | tail -4
  TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=build/dev/$v/src python -c "$probe" "3.6.0 $v" 2>&1 | tail -4
done
