"""Device probe: test_equal_share_plans_at_128_heads[bf16-lengths2-1-132] (24 x 16384, q1, 128 heads, equal shares
planned for 132 SMs, merged by the combine) under whichever Triton is first on the path, one setting a process.

    python diag37.py OUTDIR MODE      MODE: default | no-pdl | plan-from FILE (a plan saved by another process)
Saves the plan it ran (OUTDIR/plan-MODE-VERSION.pt) and prints the output's finiteness and error against the reference.
"""
import sys

import torch
import triton

sys.path.insert(0, "tests")
from paged_inputs import make_paged_batch, relative_error  # noqa: E402

import mlakit  # noqa: E402
from mlakit.kernels import decode_split_plan, triton_decode  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
decode_split_plan.EQUAL_SHARES = True
if mode == "no-pdl":
    triton_decode.COMBINE_AFTER_SPLIT = False
batch = make_paged_batch([16384] * 24, heads=128, q_len=1, page_size=64, kv_lora_rank=512, rope_dim=64,
                         kv_dtype="bf16", device="cuda", seed=88)
plan = triton_decode.plan_decode(batch.cache_seqlens, q_len=1, heads=128, kv_dtype=batch.kv_cache.dtype, num_sms=132,
                                 page_size=64)
torch.cuda.synchronize()
fields = {name: getattr(plan, name) for name in ("work", "work_state", "num_splits", "merge_state")}
torch.save({k: v.cpu() for k, v in fields.items()}, f"{out_dir}/plan-{mode.split()[0]}-{triton.__version__}.pt")
if mode.startswith("plan-from"):
    saved = torch.load(sys.argv[3])
    for name, value in saved.items():
        same = torch.equal(value, fields[name].cpu())
        print(f"plan {name}: {'same' if same else 'DIFFERENT'} as {sys.argv[3]}")
        fields[name].copy_(value.to(fields[name].device))
print("triton", triton.__version__, "mode", mode, "work_state", plan.work_state.tolist(), "max splits",
      int(plan.num_splits.max()), "work rows", plan.work.shape[0])
out, lse = triton_decode.triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                           kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=None, plan=plan)
torch.cuda.synchronize()
ref, ref_lse = mlakit.reference_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                       kv_lora_rank=512, softmax_scale=batch.softmax_scale)
finite = torch.isfinite(out.float())
bad_rows = (~finite).any(-1).nonzero()[:, :2].unique(dim=0).tolist() if not finite.all() else []
err = (out.float() - ref.float()).abs().amax(dim=(-1, -2)).flatten()
print("finite", bool(finite.all()), "rel error", float(relative_error(out, ref)), "lse max diff",
      float((lse - ref_lse).abs().nan_to_num(1e9).max()), "tokens with error > 0.05:", (err > 0.05).nonzero().flatten().tolist(),
      "bad (token, head) rows:", bad_rows[:10])
