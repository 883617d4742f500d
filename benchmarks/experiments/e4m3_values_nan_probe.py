"""Device probe of the v66 patches' NaN (seesaw with e4m3 P . V, `patches/v66d-...diff` applied): fp8 pages with
e4m3 scores on small cases, one variant a process, printing the share of NaN outputs by column half, by 64-head tile
and by sequence. Variants: `base` (also its error against the reference on rounded queries); `constp` (P = 1/64 for
every token, own and handed, its e4m3 written as bits: one tile's output is then its mean value row times 1/l: prints
the least cosine to it; the recorded runs predate the bits and their constant P was corrupt, NOTES.md "The v66 NaN");
`zerov` (values transposed as zeros: the output must be zero); `nohand` / `noown` (the handed / own P . V skipped).

Usage, from the repository root: PYTHONPATH=src python benchmarks/experiments/e4m3_values_nan_probe.py VARIANT CASE...
"""

import dataclasses
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

sys.path.insert(0, "benchmarks/experiments")
from decode_case import own_plan_kernel  # noqa: E402

from mlakit.bench.decode import DecodeCase, check_against_reference, make_inputs  # noqa: E402
from mlakit.kernels import hopper_decode as hd  # noqa: E402
from mlakit.reference import e4m3_rounded_queries  # noqa: E402
from mlakit.kernels.gluon_compat import thread_barrier  # noqa: E402


@gluon.jit
def _four(p):
    """4.0 in e4m3 wherever p is, written as bits: a converted constant meets ptxas' fold of broadcast e4m3 pairs
    (NOTES.md p32b, "The v66 NaN")."""
    return gl.full_like(p, 0x48, dtype=gl.int8).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _constant_p_values_mma(p, k_lat, half: gl.constexpr, acc, P_LAYOUT: gl.constexpr, E4M3: gl.constexpr):
    a = gl.convert_layout(_four(p), P_LAYOUT)
    return warpgroup_mma(a, hd._e4m3_values(k_lat, half).permute((1, 0)), acc, is_async=True)


@gluon.jit
def _constant_p_hand(slot, p, E4M3: gl.constexpr):
    hd._fp8_block(slot, 0, gl.float8e4nv).store(_four(p))


@gluon.jit
def _zero_values(buffer, half: gl.constexpr, valid_rows):
    hd._e4m3_values(buffer, half, gl.int32).store(gl.zeros([256, 16], gl.int32, hd.E4M3_HALF_WORDS))
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _skip_handed(slot, k_lat, half: gl.constexpr, acc, E4M3: gl.constexpr):
    return acc


@gluon.jit
def _skip_own(p, k_lat, half: gl.constexpr, acc, P_LAYOUT: gl.constexpr, E4M3: gl.constexpr):
    return acc


def least_cosine_to_mean_values(out: torch.Tensor, inputs, page_size: int) -> float:
    """The least cosine between an output row and its sequence's mean value row (the constant-P expectation)."""
    cosines = []
    for i, n in enumerate(inputs.cache_seqlens.tolist()):
        pages = inputs.block_table[i, : -(-n // page_size)].long()
        values = inputs.kv_cache[pages].reshape(-1, inputs.kv_cache.shape[-1])[:n, :512].float()
        rows = out[i].reshape(-1, 512)
        cosines.append(torch.nn.functional.cosine_similarity(rows, values.mean(0)[None], dim=1).min().item())
    return min(cosines)


variant = sys.argv[1]
patches = {"constp": {"_values_mma": _constant_p_values_mma, "_hand_p": _constant_p_hand},
           "zerov": {"_transpose_half_values": _zero_values}, "nohand": {"_handed_values_mma": _skip_handed},
           "noown": {"_values_mma": _skip_own}}
for name, function in patches.get(variant, {}).items():
    setattr(hd, name, function)
device = torch.device("cuda")
for spec in sys.argv[2:]:
    case = dataclasses.replace(DecodeCase.parse(spec), kv_dtype="fp8_e4m3")
    inputs = make_inputs(case, device)
    out = own_plan_kernel(True)(inputs)()[0].float()
    nan = torch.isnan(out)
    line = f"{variant} {spec}: nan {nan.float().mean().item():.3f}"
    if nan.any():
        share = lambda part: part.float().mean().item()  # noqa: E731
        line += (f" | by half-columns {share(nan[..., :256]):.3f} {share(nan[..., 256:]):.3f}"
                 f" | heads 0-63 {share(nan[:, :, :64]):.3f} 64+ {share(nan[:, :, 64:]):.3f}"
                 f" | seqs {share(nan.flatten(1).any(1)):.3f}")
    if variant == "base":
        error = check_against_reference(own_plan_kernel(True), inputs, reference_queries=e4m3_rounded_queries)
        line += f" | err vs rounded ref {error:.3e}"
    elif variant == "constp":
        line += f" | min cos to mean V {least_cosine_to_mean_values(out, inputs, case.page_size):.4f}"
    elif variant == "zerov":
        line += f" | max |out| {out.nan_to_num(0).abs().max().item():.3e}"
    print(line, flush=True)
