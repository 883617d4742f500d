"""Device check (issue 22, NOTES p32): the fp8 prefill's lse and out against the float32 oracle on the same e4m3
values, one head, a few small segments. Prints each case's lse differences (the log of our row sums over the
oracle's) and the ratio of the output rows' norms: a wrong row sum shows as a shift in both.

    PYTHONPATH=src:tests python benchmarks/experiments/fp8_prefill_row_sums_check.py
"""
import torch
from mlakit.prefill.fp8 import fp8_mha_prefill, quantize_prefill_operands
from test_prefill import _kernel_inputs, _oracle_pass, _segments
dev = "cuda"
for q_len, k_len, causal in [(64, 128, False), (128, 128, False), (128, 256, False), (128, 128, True), (64, 512, False)]:
    q, kn, kp, v = _kernel_inputs([q_len], [k_len], 1, 128, 64, 128, torch.bfloat16, seed=0, device=dev, pad_rows=0)
    keys, queries = _segments([k_len], dev), _segments([q_len], dev)
    ops = quantize_prefill_operands(q, kn, kp, v, keys.cu_seqlens)
    scale = 192 ** -0.5
    out, lse = fp8_mha_prefill(ops, queries.cu_seqlens, max_q_len=q_len, causal=causal, softmax_scale=scale)
    dq = ops.dequantized()
    ref_out, ref_lse = _oracle_pass(*dq, queries, keys, causal=causal, softmax_scale=scale)
    d = (lse - ref_lse)[:, 0]
    ratio = (out.float().norm(dim=-1) / ref_out.float().norm(dim=-1))[:, 0]
    print(q_len, k_len, causal, "lse diff rows 0,1,8,63:", [round(x, 4) for x in d[[0, 1, 8, 63]].tolist()],
          "exp(diff) median", round(d.exp().median().item(), 4), "out norm ratio median", round(ratio.median().item(), 4),
          "min", round(ratio.min().item(), 4), "max", round(ratio.max().item(), 4), flush=True)
