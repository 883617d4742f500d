"""CPU experiment (v66's accuracy, before any kernel): the output error that rounding P to e4m3 adds, P scaled by 256
(row max 1 -> 256) as the kernel would, against the reference on the same e4m3-rounded queries, on the e4m3 GPU test's
batch and on longer sequences. The kernel rounds each tile's P against the running max; here against the row's final
max (the same relative rounding).

Usage: PYTHONPATH=src:tests python benchmarks/experiments/e4m3_values_error.py
"""

import torch
from paged_inputs import make_paged_batch, relative_error

from mlakit.reference import e4m3_rounded_queries, reference_decode

P_SCALE = 256.0


def decode_with_rounded_p(batch, q):
    """`reference_decode` on queries `q` with each sequence's weights exp(s - max) x P_SCALE rounded to e4m3."""
    outs = []
    for b, length in enumerate(batch.cache_seqlens.tolist()):
        q_len = q.shape[1]
        if length == 0:
            outs.append(torch.zeros(q_len, q.shape[2], batch.kv_lora_rank))
            continue
        pages = batch.block_table[b, : -(-length // batch.kv_cache.shape[1])].long()
        rows = (batch.kv_cache[pages].float() * batch.kv_scale.float()).reshape(-1, batch.kv_cache.shape[-1])[:length]
        scores = torch.einsum("ihd,td->iht", q[b].float(), rows) * batch.softmax_scale
        visible = torch.arange(length)[None, :] < (length - q_len + 1 + torch.arange(q_len))[:, None]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        top = scores.amax(-1, keepdim=True).clamp(min=-1e30)
        weights = torch.exp(scores - top)
        rounded = (weights * P_SCALE).to(torch.float8_e4m3fn).float() / P_SCALE
        out = torch.einsum("iht,td->ihd", rounded, rows[:, : batch.kv_lora_rank]) / weights.sum(-1, keepdim=True)
        outs.append(torch.nan_to_num(out))
    return torch.stack(outs)


for seq_lens, heads, q_len in (([3000, 0, 1, 63, 700, 129], 128, 1), ([3000, 0, 1, 63, 700, 129], 33, 3),
                               ([4096] * 4, 128, 2), ([16384], 16, 1)):
    batch = make_paged_batch(seq_lens, heads=heads, q_len=q_len, page_size=64, kv_lora_rank=512, rope_dim=64,
                             kv_dtype="fp8_e4m3", seed=heads + q_len)
    q = e4m3_rounded_queries(batch.q)
    exact, _ = reference_decode(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, kv_lora_rank=512,
                                softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale)
    emulated = decode_with_rounded_p(batch, q)
    per_sequence = [f"{relative_error(emulated[b], exact[b]):.1e}" for b in range(len(seq_lens)) if seq_lens[b] > 0]
    print(f"{seq_lens} x {heads} heads x q{q_len}: P in e4m3 adds {relative_error(emulated, exact):.2e} "
          f"(per sequence {', '.join(per_sequence)})")
