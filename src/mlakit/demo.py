"""`make demo`: resolve a plan, fill a paged cache, run one decode step, check it in float64."""

from __future__ import annotations

import time

import torch
from rich.console import Console

from mlakit.api import mla_decode
from mlakit.cache import PagedLatentCache
from mlakit.config import ServingConfig
from mlakit.device import DeviceInfo
from mlakit.reference import reference_decode
from mlakit.registry.resolve import resolve
from mlakit.report import print_plan
from mlakit.shape import MLAShape

DEMO_SEQ_LENS = (1, 100, 513, 0, 64, 1000)
DEMO_MAX_ERROR = 1e-2


def run_decode_demo(device: str, seed: int, console: Console) -> int:
    """Returns the process exit code: 0 when the decode matches the float64 reference."""
    shape = MLAShape.preset("deepseek-v3")
    config = ServingConfig(device=device, tp_size=8, max_batch_size=len(DEMO_SEQ_LENS), max_context_len=4096)
    plan = resolve(config, shape)
    print_plan(plan, console)
    torch.manual_seed(seed)
    dev = plan.device.torch_device
    rank = plan.rank_shape
    total_pages = sum(-(-n // plan.page_size) for n in DEMO_SEQ_LENS) + 4
    cache = PagedLatentCache(
        total_pages, plan.page_size, rank.kv_lora_rank, rank.qk_rope_head_dim, dtype=plan.kv_cache_dtype, device=dev
    )
    seq_ids = list(range(len(DEMO_SEQ_LENS)))
    for seq_id, length in zip(seq_ids, DEMO_SEQ_LENS):
        cache.append(seq_id, torch.randn(length, rank.kv_lora_rank, device=dev), torch.randn(length, rank.qk_rope_head_dim, device=dev))
    q = torch.randn(len(seq_ids), plan.decode_q_len, rank.num_heads, rank.kv_cache_dim, device=dev, dtype=torch.bfloat16)
    table, lens = cache.block_table(seq_ids), cache.seq_lens(seq_ids)

    start = time.perf_counter()
    out, lse = mla_decode(
        q, cache.data, table, lens, softmax_scale=rank.softmax_scale, backend=plan.decode_backend, kv_scale=cache.scale
    )
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed_ms = (time.perf_counter() - start) * 1e3
    ref_out, ref_lse = reference_decode(
        q, cache.data, table, lens, kv_lora_rank=rank.kv_lora_rank, softmax_scale=rank.softmax_scale,
        kv_scale=cache.scale, compute_dtype=torch.float64,
    )
    error = float((out.double() - ref_out).norm() / ref_out.norm())
    lse_error = float((lse.double() - ref_lse).nan_to_num(posinf=0, neginf=0).abs().max())
    console.print(
        f"decode: batch {len(seq_ids)} (lengths {list(DEMO_SEQ_LENS)}), {rank.num_heads} heads per rank, "
        f"page {plan.page_size}, {plan.kv_cache_dtype} KV on {plan.decode_backend}: {elapsed_ms:.1f} ms"
    )
    ok = error < DEMO_MAX_ERROR and lse_error < 1e-3
    console.print(
        f"verdict: {'PASS' if ok else 'FAIL'} - output relative error {error:.2e} (limit {DEMO_MAX_ERROR:.0e}), "
        f"lse max error {lse_error:.2e} against the float64 reference"
    )
    return 0 if ok else 1
