"""Device experiment: per query-row magnitude (each head a power of two from 2^-17 to 2^17, fp16 to 2^13, one row zero),
the lse and output errors of fp8 decode at 128 heads with e4m3 scores (against the reference on rounded queries) and
with fp16 MMAs (against the reference on the queries as given): the 8-bit tensor cores' sum error grows with the scores
(NOTES.md v63).

Usage: PYTHONPATH=src:tests python benchmarks/experiments/e4m3_score_magnitudes.py
"""

import torch
from paged_inputs import E4M3_QUERY_EXPONENTS, make_paged_batch, with_query_magnitudes

from mlakit.kernels.triton_decode import plan_decode, triton_mla_decode
from mlakit.reference import e4m3_rounded_queries, reference_decode

for q_dtype in (torch.bfloat16, torch.float16):
    exponents = E4M3_QUERY_EXPONENTS[q_dtype]
    batch = with_query_magnitudes(make_paged_batch([900, 5, 64], heads=128, q_len=1, page_size=64, kv_lora_rank=512,
                                                   rope_dim=64, kv_dtype="fp8_e4m3", q_dtype=q_dtype, device="cuda",
                                                   seed=21), exponents)
    for e4m3 in (True, False):
        plan = plan_decode(batch.cache_seqlens, q_len=1, heads=128, kv_dtype=batch.kv_cache.dtype, e4m3_scores=e4m3)
        out, lse = triton_mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, plan=plan,
                                     kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
        ref_q = e4m3_rounded_queries(batch.q) if e4m3 else batch.q
        ref_out, ref_lse = reference_decode(ref_q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
                                            kv_lora_rank=512, softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
        print(q_dtype, "e4m3" if e4m3 else "fp16 mma")
        for h, exponent in enumerate(exponents):
            heads = [i for i in range(h, 128, len(exponents)) if i != 3]
            lse_error = (lse[:, heads] - ref_lse[:, heads]).abs().nan_to_num().max().item()
            lse_size = ref_lse[:, heads].abs().nan_to_num().max().item()
            ours, theirs = out[:, :, heads].float(), ref_out[:, :, heads].float()
            print(f"  exponent {exponent:+5.0f}: lse err {lse_error:.3e} (|lse| up to {lse_size:.3e}), "
                  f"out rel err {((ours - theirs).norm() / theirs.norm()).item():.2e}")
        zero_error = (out[:, :, 3].float() - ref_out[:, :, 3]).norm() / ref_out[:, :, 3].norm()
        print(f"  zero row: lse err {(lse[:, 3] - ref_lse[:, 3]).abs().nan_to_num().max().item():.2e}, "
              f"out err {zero_error.item():.2e}")
