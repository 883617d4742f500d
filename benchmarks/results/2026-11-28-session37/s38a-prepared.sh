#!/usr/bin/env bash
# Prepared, not run (the thirty-seventh session's device time is spent). v101: the share plan's round count taken
# before the runtime `if` that 3.7.1 miscompiles (benchmarks/experiments/patches/v101-share-rounds-outside-the-branch.diff).
# Under a packed Triton 3.7.1 (pack_triton.sh 3.7.1 build/triton37 on the host first): the plan of 24 x 16384 x 1 at
# 128 heads (132 items expected, HEAD gives 66), then the share layout tests on the GPU, on a copy of src with the
# patch. If both pass, land the patch, add "3.7." to SHARE_PLAN_TRITONS and run the decode GPU tests under 3.7.1.
# Carry ["build/triton37"].
set -uo pipefail
R=$OUT/s38a
mkdir -p $R build/dev/v101
source benchmarks/experiments/with_packed_triton.sh build/triton37
cp -r src build/dev/v101/ && patch -p1 -d build/dev/v101 < benchmarks/experiments/patches/v101-share-rounds-outside-the-branch.diff
probe='
import torch
from mlakit.kernels import decode_split_plan, triton_decode
decode_split_plan.SHARE_PLAN_TRITONS = ("",)
lengths = torch.full((24,), 16384, dtype=torch.int32, device="cuda")
plan = triton_decode.plan_decode(lengths, q_len=1, heads=128, kv_dtype=torch.bfloat16, num_sms=132, page_size=64)
print(decode_split_plan.__file__, "work_state", plan.work_state.tolist())
'
TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PACKED_TRITON:build/dev/v101/src python -c "$probe" | tee $R/plan.txt
TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PACKED_TRITON:build/dev/v101/src timeout 200 python -m pytest -q -rA \
  -p no:cacheprovider -o pythonpath=build/dev/v101/src tests/test_decode_share_plan.py > $R/layout-tests.txt 2>&1
grep -E "passed|failed|xfail|xpass" $R/layout-tests.txt | tail -2
