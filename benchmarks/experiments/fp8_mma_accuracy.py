"""CPU experiment: how far fp8 (e4m3) MMAs would move the decode output from the reference.

Usage: python benchmarks/experiments/fp8_mma_accuracy.py [SEQLEN ...]
For one sequence at 16 and 128 heads, N(0, 1) data as in the benchmark (cache quantized to e4m3 with
a per-tensor scale of 1), compares with the fp32 reference on the dequantized cache:
- "bf16 MMAs": Q and P in bf16, K and V dequantized exactly (what the kernels compute today);
- "fp8 QK": Q quantized to e4m3 per row (scale = row amax / 448), S from e4m3 x e4m3 products;
- "fp8 QK/64": the same with one scale per row and 64-column chunk (nine partial S summed);
- "fp8 QK + PV": also P quantized to e4m3 (scaled by 448, P <= 1) for P . V.
Prints the relative Frobenius error of the output (the issue's fp8 bound is 3e-2).
"""

import sys

import torch

E4M3_MAX = 448.0
LATENT, ROPE = 512, 64


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values of `x` scaled per row so each row's largest magnitude maps to 448, and the scales."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn).float(), scale


def attention(q: torch.Tensor, k: torch.Tensor, softmax_scale: float, fp8_qk: int, fp8_pv: bool) -> torch.Tensor:
    """fp8_qk: 0 for bf16 Q, else the width of the column chunks Q is scaled by."""
    v = k[:, :LATENT]
    if fp8_qk:
        s = 0
        for col in range(0, q.shape[1], fp8_qk):
            q8, q_scale = quantize_rows(q[:, col:col + fp8_qk])
            s = s + (q8 @ k[:, col:col + fp8_qk].T) * q_scale
    else:
        s = q.bfloat16().float() @ k.T
    p = torch.softmax(s * softmax_scale, dim=-1)
    if fp8_pv:
        p = (p * E4M3_MAX).to(torch.float8_e4m3fn).float() / E4M3_MAX
    else:
        p = p.bfloat16().float()
    return p @ v


def main() -> None:
    lengths = [int(x) for x in sys.argv[1:]] or [1024, 4096, 16384]
    gen = torch.Generator().manual_seed(0)
    softmax_scale = 192 ** -0.5
    for heads in (16, 128):
        for seqlen in lengths:
            k = torch.randn(seqlen, LATENT + ROPE, generator=gen).to(torch.float8_e4m3fn).float()
            q = torch.randn(heads, LATENT + ROPE, generator=gen).bfloat16().float()
            ref = torch.softmax((q @ k.T) * softmax_scale, dim=-1) @ k[:, :LATENT]
            errors = {
                name: float((attention(q, k, softmax_scale, qk, pv) - ref).norm() / ref.norm())
                for name, qk, pv in (("bf16 MMAs", 0, False), ("fp8 QK", LATENT + ROPE, False), ("fp8 QK/64", 64, False),
                                     ("fp8 QK + PV", LATENT + ROPE, True))
            }
            print(f"{heads:4d} heads {seqlen:6d} tokens: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


if __name__ == "__main__":
    main()
