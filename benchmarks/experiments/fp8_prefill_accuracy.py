"""CPU experiment: how accurate an FP8 (e4m3) MHA-form prefill would be (issue 22's goal beyond), before building it.

Usage: python benchmarks/experiments/fp8_prefill_accuracy.py [--demo]

1. Synthetic passes (8 heads, 1024 causal tokens, qk 128 + 64, v 128), the relative Frobenius error of the output
   against float32 attention on the unquantized inputs, for N(0, 1) data (as `mlakit bench prefill` uses) and for
   data with outlier channels (4 of q's and k's 192 channels x 8, as real activations have):
   - "bf16": q, k, v and P in bf16, float32 accumulation (what the Hopper kernel computes today);
   - "fp8 qk": q and k in e4m3 with one scale per tensor (amax / 448), P and v in bf16 (only S = Q K^T in fp8);
   - "fp8 qkv": q, k, v in e4m3 per tensor, P in e4m3 scaled by 448 (P <= 1) for P V (both GEMMs in fp8);
   - "fp8 qkv/head": the same with one scale per head;
   - "fp8 qkv rotated": "fp8 qkv" after rotating q and k (and v) by 64 x 64 Hadamard blocks, which leaves Q K^T
     (and P V, rotated back) unchanged and spreads outlier channels before the per-tensor scale is taken.
2. With --demo: the demo model (float32, CPU) generating its prompts with every prefill attention pass computed as
   "fp8 qkv" (decode exact), checked against transformers token by token (`mlakit.demo.verdict`).
"""

import sys

import torch

E4M3_MAX = 448.0
HEADS, TOKENS, NOPE, ROPE, V_DIM = 8, 1024, 128, 64, 128


def e4m3(x: torch.Tensor, per_head: bool = False) -> torch.Tensor:
    """`x [tokens, heads, width]` rounded through e4m3 with one scale per tensor (or per head), back in float32."""
    amax = x.abs().amax(dim=(0, 2), keepdim=True) if per_head else x.abs().amax()
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def block_hadamard(width: int, block: int = 64) -> torch.Tensor:
    """An orthogonal `[width, width]` matrix: normalized 64 x 64 Hadamard blocks on the diagonal (spreads a few
    outlier channels over their block before a per-tensor scale is taken; Q K^T and P V are unchanged by it)."""
    h = torch.ones(1, 1)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.block_diag(*[h / block**0.5] * (width // block))


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, variant: str) -> torch.Tensor:
    """Attention of `q [n, H, dk]` over `k [m, H, dk]`, `v [m, H, dv]` with the variant's roundings (module docstring)."""
    if variant == "fp32":
        rq, rk, rv = q, k, v
    elif variant in ("bf16", "fp8 qk"):
        rq, rk, rv = (e4m3(q), e4m3(k), bf16(v)) if variant == "fp8 qk" else (bf16(q), bf16(k), bf16(v))
    elif variant == "fp8 qkv rotated":
        rotate_qk, rotate_v = block_hadamard(q.shape[-1]), block_hadamard(v.shape[-1])
        rq, rk = e4m3(q @ rotate_qk) @ rotate_qk.T, e4m3(k @ rotate_qk) @ rotate_qk.T
        rv = e4m3(v @ rotate_v) @ rotate_v.T
    else:
        per_head = variant == "fp8 qkv/head"
        rq, rk, rv = e4m3(q, per_head), e4m3(k, per_head), e4m3(v, per_head)
    scores = torch.einsum("nhd,mhd->hnm", rq, rk) * scale
    n, m = q.shape[0], k.shape[0]
    if causal:
        visible = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
        scores = scores.masked_fill(~visible[None], float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0)
    p = torch.exp(scores - peak)
    total = p.sum(dim=-1, keepdim=True)
    if variant.startswith("fp8 qkv"):
        p = (p * E4M3_MAX).to(torch.float8_e4m3fn).float() / E4M3_MAX
    elif variant != "fp32":
        p = bf16(p)
    return torch.einsum("hnm,mhd->nhd", p, rv) / total.transpose(0, 1).clamp(min=1e-30)


def synthetic() -> None:
    gen = torch.Generator().manual_seed(0)
    for kind in ("N(0,1)", "outliers"):
        q = torch.randn(TOKENS, HEADS, NOPE + ROPE, generator=gen)
        k = torch.randn(TOKENS, HEADS, NOPE + ROPE, generator=gen)
        v = torch.randn(TOKENS, HEADS, V_DIM, generator=gen)
        if kind == "outliers":
            q[..., :4] *= 8
            k[..., :4] *= 8
        scale = (NOPE + ROPE) ** -0.5
        want = attend(q, k, v, scale, True, "fp32")
        errors = []
        for variant in ("bf16", "fp8 qk", "fp8 qkv", "fp8 qkv/head", "fp8 qkv rotated"):
            got = attend(q, k, v, scale, True, variant)
            errors.append(f"{variant} {float((got - want).norm() / want.norm()):.2e}")
        print(f"{kind:9s} causal {TOKENS} tokens x {HEADS} heads: " + ", ".join(errors))


def demo() -> None:
    from rich.console import Console

    import mlakit.prefill.mha as mha
    from mlakit.config import ServingConfig
    from mlakit.demo.checkpoint import DEMO_DIR, ensure_demo_checkpoint
    from transformers import AutoModelForCausalLM

    from mlakit.demo.run import CACHE_BUDGET_BYTES, DEMO_NEW_TOKENS, DEMO_PROMPTS
    from mlakit.demo.verdict import gap_bound, teacher_forced_verdict
    from mlakit.model.generate import build_runner
    from mlakit.model.runner import Request

    console = Console()
    ensure_demo_checkpoint(DEMO_DIR, say=print)

    def fp8_attend_heads(q, k, v, softmax_scale, causal):
        n, m = q.shape[0], k.shape[0]
        if n == 0 or m == 0:
            return exact(q, k, v, softmax_scale, causal)
        _, lse = exact(q, k, v, softmax_scale, causal)
        return attend(q, k, v, softmax_scale, causal, "fp8 qkv"), lse

    exact = mha.attend_heads
    mha.attend_heads = fp8_attend_heads
    config = ServingConfig(device="cpu", prefill_backend="reference", max_batch_size=len(DEMO_PROMPTS),
                           max_context_len=256)
    runner = build_runner(DEMO_DIR, config, CACHE_BUDGET_BYTES, console, mixed_steps=True)
    outputs = runner.generate([Request(list(p), DEMO_NEW_TOKENS, arrival_step=2 * i) for i, p in enumerate(DEMO_PROMPTS)])
    mha.attend_heads = exact
    hf = AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()
    verdict = teacher_forced_verdict(hf, DEMO_PROMPTS, outputs, gap_bound(runner.cache.stores[0].dtype))
    for d in verdict.divergences:
        print(f"  prompt {d.prompt}, token {d.position}: fp8 prefill {d.ours}, transformers {d.theirs}, gap {d.gap:.2g}")
    print(f"demo, every prefill pass in fp8 (q, k, v, P in e4m3), decode exact: {verdict.summary()}")


if __name__ == "__main__":
    synthetic()
    if "--demo" in sys.argv[1:]:
        demo()
