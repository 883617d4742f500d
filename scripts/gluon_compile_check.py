#!/usr/bin/env python3
"""Compiles the Gluon kernels (and the decode split-plan kernel) for sm_90a without a GPU, specialized as a launch
would specialize them (argument dtypes, 16-byte alignment and divisibility, constexprs), and reports per configuration
shared memory, spills (ptxas -v), the PTX's barrier, wgmma and wgmma-wait counts, a digest of the SASS and its
predicated warp collectives (a ptxas fault under Triton 3.7, `predicated_warp_collectives`).

    python scripts/gluon_compile_check.py                      # the prefill kernel, with the installed triton
    python scripts/gluon_compile_check.py --kernel hopper_persistent   # its persistent form (or: both)
    python scripts/gluon_compile_check.py --kernel seesaw      # the decode seesaw (`hopper_decode`)
    python scripts/gluon_compile_check.py --kernel narrow --heads 16 --q-lens 1,2   # the narrow fp8 decode kernel
    python scripts/gluon_compile_check.py --kernel split       # the decode cp.async split kernel (or: fp8_split)
    python scripts/gluon_compile_check.py --kernel plan        # the decode split-plan kernel (a Triton kernel)
    python scripts/gluon_compile_check.py --scan-cache DIR     # every kernel a GPU run compiled into a Triton cache
    python scripts/gluon_compile_check.py --kernel seesaw --heads 128 --q-lens 2 --loop-syncs   # + each inner loop's
                                                               # warpgroup syncs by source line
    PYTHONPATH=/path/to/triton-3.6/site-packages python scripts/gluon_compile_check.py   # the device's version

Gluon kernels do not run under the CPU interpreter; this catches what the compiler refuses (layouts,
shapes, shared memory over the limit) and register spills before device time is spent.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import click
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, make_backend
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
from triton.runtime.jit import create_function_from_signature

from mlakit.kernels import hopper_decode as hd
from mlakit.kernels import hopper_narrow_decode as nd
from mlakit.kernels import hopper_prefill as hp
from mlakit.kernels import decode_split_plan, triton_decode
from mlakit.kernels.decode_split_plan import WORK_FIELDS
from mlakit.kernels.hopper_common import matrix_descriptor, row_descriptors
from mlakit.kernels.l2_evict_first import streams_evict_first
from mlakit.kernels.launch import COMPILE_OPTIONS

SM90 = GPUTarget("cuda", 90, 32)


def compile_like_launch(fn: object, args: list[object], constants: dict[str, object]) -> object:
    """`fn` (a Gluon or a Triton kernel) compiled for sm_90a as `fn[grid](*args, **constants)` would compile it on an
    H100: Triton's own binder (for the sm_90 backend) specializes the arguments."""
    backend = make_backend(SM90)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    constants = {**COMPILE_OPTIONS, **constants}
    bound, specialization, options = binder(*args, **constants)
    options, signature, constexprs, attrs = fn._pack_args(backend, constants, bound, specialization, options)
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    return triton.compile(source(fn, signature, constexprs, attrs), target=SM90, options=options.__dict__)


def disassembly(kernel: object, line_info: bool = False) -> str:
    """A compiled kernel's SASS (nvdisasm; with `line_info`, its source-line comments)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "k.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        return cubin_disassembly(cubin, line_info)


def cubin_disassembly(cubin: Path, line_info: bool = False) -> str:
    """A cubin file's SASS (nvdisasm beside the ptxas Triton uses; with `line_info`, its source-line comments)."""
    nvdisasm = str(Path(get_ptxas(90).path).with_name("nvdisasm"))
    return subprocess.run([nvdisasm, *(["-g"] if line_info else []), "-c", str(cubin)], capture_output=True,
                          text=True, check=True).stdout


def scan_cache(folder: Path, disassemble: Callable[[Path], str] = cubin_disassembly) -> dict[str, list[str]]:
    """Every kernel a Triton cache folder holds (what a GPU run compiled into its TRITON_CACHE_DIR), as
    "<cache entry>/<kernel>", with its predicated warp collectives (`predicated_warp_collectives`): the check of the
    compile test over every build and specialization the run made.

        TRITON_CACHE_DIR=/tmp/cache pytest -m gpu ...; python scripts/gluon_compile_check.py --scan-cache /tmp/cache
    """
    cubins = sorted(folder.rglob("*.cubin"))
    with concurrent.futures.ThreadPoolExecutor() as pool:  # nvdisasm processes: a GPU run's cache holds hundreds
        listings = pool.map(disassemble, cubins)
        return {f"{cubin.parent.name[:10]}/{cubin.stem}": predicated_warp_collectives(listing)
                for cubin, listing in zip(cubins, listings)}


def instruction(line: str) -> str | None:
    """The instruction of an nvdisasm listing line (`/*0a30*/  @P0 BRA ... ;` -> `@P0 BRA ...`), None for any other."""
    if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line) and ";" in line:
        return line.split("*/", 1)[1].split(";")[0].strip()
    return None


def instruction_digest(sass: str) -> tuple[int, str]:
    """An nvdisasm listing's instruction count and a digest of its instructions with addresses, branch targets,
    register numbers and reuse flags left out: two builds with equal digests run the same instructions in the same
    order (how a landed version is checked against the tree that was measured)."""
    instructions = [text for line in sass.splitlines() if (text := instruction(line))]
    text = re.sub(r"\b(U?R|U?P)\d+\b|\.reuse\b|`\(\.L_x_\d+\)|0x7f[0-9a-f]+", r"\1", "\n".join(instructions))
    return len(instructions), hashlib.md5(text.encode()).hexdigest()[:10]


def predicated_warp_collectives(sass: str) -> list[str]:
    """An nvdisasm listing's warp reductions (REDUX) and shuffles (SHFL, the reductions of small vectors) under a
    predicate. Triton reduces in warp-uniform code, so such an instruction is ptxas's if-conversion of a runtime `if`
    around a reduction, and for Triton 3.7's PTX ptxas 12.8 predicates it on the wrong register: the plan kernel
    counted its items short (NOTES.md, "The plan kernel under Triton 3.7"). The kernels keep reductions out of such
    branches; this finds one that is not."""
    return [text for line in sass.splitlines()
            if (text := instruction(line)) and re.match(r"@!?U?P\d+\s+(REDUX|SHFL)\b", text)]


def predicated_summary(predicated: list[str]) -> str:
    """A kernel's `predicated_warp_collectives` as reported: their count, then each instruction on an indented line."""
    return f"predicated warp collectives {len(predicated)}" + "".join(f"\n    {p}" for p in predicated)


def located_lines(listing: str) -> Iterator[tuple[str, str]]:
    """The lines of an nvdisasm listing with line information (`disassembly(kernel, line_info=True)`) but its
    source-line comments, each with the source file:line it comes from ("?" before the first)."""
    where = "?"
    for line in listing.splitlines():
        if source := re.search(r'//## File "([^"]+)", line (\d+)', line):
            where = f"{Path(source.group(1)).name}:{source.group(2)}"
        else:
            yield where, line


def spill_lines(listing: str) -> list[tuple[str, str, int]]:
    """Where a listing's spill stores and loads (SASS STL / LDL) come from (`located_lines`): (source file:line, STL
    or LDL, count), most first."""
    counts = collections.Counter((where, spill.group(1)) for where, line in located_lines(listing)
                                 if (spill := re.search(r"\b(STL|LDL)\b", line)))
    return [(where, op, n) for (where, op), n in counts.most_common()]


def loop_syncs(listing: str, min_size: int = 200) -> list[tuple[int, collections.Counter]]:
    """The innermost loops of an nvdisasm listing with line information (`located_lines`) of at least `min_size`
    instructions: each loop's size and its warpgroup-wide syncs (`BAR.SYNC` of 128 threads: the kernels'
    `gluon_compat.thread_barrier` and the ones the compiler's barrier analysis adds) by source line, in program
    order. A branch to an earlier label closes a loop; a loop holding another is not innermost."""
    labels, pending, rows = {}, [], []
    for where, line in located_lines(listing):
        if label := re.match(r"\s*(\.L_x_\d+):", line):
            pending.append(label.group(1))
        elif text := instruction(line):
            labels.update((name, len(rows)) for name in pending)
            pending = []
            rows.append((text, where))
    loops = [(labels[target.group(1)], end) for end, (text, _) in enumerate(rows)
             if (target := re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)) and labels.get(target.group(1), end) < end]
    innermost = [(first, last) for first, last in loops if last - first + 1 >= min_size
                 and not any((a, b) != (first, last) and first <= a and b <= last for a, b in loops)]
    return [(last - first + 1, collections.Counter(where for text, where in rows[first:last + 1]
                                                   if re.search(r"\bBAR\.SYNC\b.*,\s*0x80\b", text)))
            for first, last in sorted(innermost)]


@dataclasses.dataclass(frozen=True)
class Details:
    """What `report` adds to its line: the source lines of the spills, the innermost loops' warpgroup syncs."""

    spills: bool = False
    loop_syncs: bool = False


def report(compile_kernel: Callable[[], object], details: Details = Details()) -> str:
    """A compiled kernel's shared memory, spills (ptxas -v) and PTX barrier / wgmma / wgmma-wait counts, or the
    compiler's error (the innermost of its chain); with `details`, the source lines of its spills and its innermost
    loops' warpgroup syncs by source line (`loop_syncs`)."""
    try:
        kernel = compile_kernel()
    except Exception as exc:
        while exc.__cause__ is not None or exc.__context__ is not None:
            exc = exc.__cause__ or exc.__context__
        return f"FAILED: {type(exc).__name__}: {str(exc)[-1500:]}"
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.ptx")
        path.write_text(ptx)
        ptxas = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp, "k.cubin"))],
                               capture_output=True, text=True).stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    barriers = len(re.findall(r"^\s*(?:@%p\d+\s+)?(?:bar|barrier)\.", ptx, re.M))
    mmas, waits = len(re.findall(r"wgmma\.mma_async", ptx)), len(re.findall(r"wgmma\.wait_group", ptx))
    hinted = len(re.findall(r"cp\.async\.bulk\.tensor\S*\.L2::cache_hint", ptx))
    sass = disassembly(kernel)
    count, digest = instruction_digest(sass)
    line = (f"ok: shared {kernel.metadata.shared} B, spills (stores, loads) {spills}, barriers {barriers}, "
            f"wgmma {mmas}, wgmma waits {waits}, TMA loads with an L2 hint {hinted}, SASS {count} digest {digest}, "
            f"predicated warp collectives {len(predicated_warp_collectives(sass))}")
    listing = disassembly(kernel, line_info=True) if details.spills or details.loop_syncs else ""
    if details.spills:
        line += "".join(f"\n    {n:4d} {op} {where}" for where, op, n in spill_lines(listing))
    if details.loop_syncs:
        for size, by_line in loop_syncs(listing):
            line += f"\n    loop of {size} instructions, {sum(by_line.values())} warpgroup syncs: " + ", ".join(
                f"{where} x{n}" if n > 1 else where for where, n in by_line.items())
    return line


def _prefill_arguments(nope: int, rope: int, v_dim: int, block_n: int, dtype: torch.dtype) -> list[object]:
    """Stand-ins for the prefill kernel's runtime arguments (a 16-head batch of CPU tensors: only dtypes, alignment
    and the descriptors' boxes matter)."""
    heads, tokens = 16, 256
    fp8 = dtype == hd.FP8_DTYPE
    q = torch.empty(tokens, heads, nope + rope, dtype=dtype)
    kv = torch.empty(tokens, heads, nope + v_dim, dtype=dtype)
    k_pe = torch.empty(tokens, rope, dtype=dtype)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    if fp8:  # e4m3 values come transposed
        v = torch.empty(heads, v_dim, tokens, dtype=dtype)
    columns = hp.TMA_BYTES // q.element_size()
    descriptors = [
        matrix_descriptor(hp.head_rows(q), (64, min(columns, nope))),
        matrix_descriptor(hp.head_rows(q), (64, rope)),
        matrix_descriptor(hp.head_rows(k_nope), (block_n, min(columns, nope))),
        matrix_descriptor(hp.head_rows(k_pe), (block_n, rope)),
        matrix_descriptor(hp.value_matrix(v), (v_dim, block_n) if fp8 else (block_n, min(columns, v_dim))),
    ]
    out = torch.empty(tokens, heads, v_dim, dtype=torch.bfloat16 if fp8 else dtype)
    lse = torch.empty(tokens, heads)
    cu = torch.zeros(3, dtype=torch.int32)
    scales = torch.ones(2)
    return [*descriptors, out, lse, cu, cu, scales, cu, 0.5, q.stride(1), k_nope.stride(1), v_dim if fp8 else v.stride(1),
            out.stride(0), out.stride(1), lse.stride(0)]


# The prefill kernels by `PrefillTuning.kernel` name, and the persistent one's schedule arguments (units, row
# blocks, heads, head group: unspecialized, any values do) and its int32 unit counter.
KERNELS = {"hopper": hp.mha_prefill_hopper_kernel, "hopper_persistent": hp.mha_prefill_hopper_persistent_kernel}
SCHEDULE = [1000, 10, 100, 7, torch.zeros(1, dtype=torch.int32)]


def compile_one(nope: int, rope: int, v_dim: int, block_n: int, stages: int, causal: bool, merge: bool,
                dtype: torch.dtype, kernel: str = "hopper", details: Details = Details()) -> str:
    """One prefill configuration compiled to a cubin: `report`'s line."""
    arguments = _prefill_arguments(nope, rope, v_dim, block_n, dtype) + (SCHEDULE if kernel == "hopper_persistent"
                                                                         else [])
    constants = dict(NOPE_DIM=nope, ROPE_DIM=rope, V_DIM=v_dim, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                     MERGE=merge, num_warps=4)
    if kernel == "hopper_persistent":
        constants["Q_BUFFERS"] = hp.q_buffers(nope, rope, v_dim, block_n, stages, dtype.itemsize)
    return report(lambda: compile_like_launch(KERNELS[kernel], arguments, constants), details)


def seesaw_arguments(heads: int, q_len: int, kv_dtype: torch.dtype, merge: bool, batch: int = 64, page_size: int = 64,
                     kv_lora_rank: int = 512, rope_dim: int = 64, e4m3_scores: bool = False,
                     part_dtype: torch.dtype | None = None) -> tuple[list[object], dict[str, object]]:
    """Stand-ins for the decode seesaw's arguments and constants, laid out as `triton_decode`'s launch passes them
    through `hopper_decode.prepare` (a decode lse `[batch, heads, q_len]`, partials of `part_dtype` padded to 16
    rows; by default the dtype `hopper_decode.partial_dtype` gives a bf16 output)."""
    tokens = batch * q_len
    q = torch.empty(tokens, heads, kv_lora_rank + rope_dim, dtype=torch.bfloat16)
    pages = torch.empty(256, page_size, kv_lora_rank + rope_dim, dtype=kv_dtype)
    block_table = torch.zeros(batch, 64, dtype=torch.int32)
    seqlens = torch.zeros(batch, dtype=torch.int32)
    work = torch.zeros(1024, WORK_FIELDS, dtype=torch.int32)
    work_state = torch.zeros(3, dtype=torch.int32)
    merge_state = torch.zeros(batch * 4, dtype=torch.int32)
    out = torch.empty(tokens, heads, kv_lora_rank, dtype=torch.bfloat16)
    lse = torch.empty(batch, heads, q_len, dtype=torch.float32)
    if part_dtype is None:
        part_dtype = hd.partial_dtype(out.dtype, pages, kv_lora_rank, rope_dim)
    part_out = torch.empty(batch, 4, -(-q_len * heads // 16) * 16, kv_lora_rank, dtype=part_dtype)
    part_lse = torch.empty(part_out.shape[:3], dtype=torch.float32)
    strides = ((q.stride(0), q.stride(1)), (pages.stride(0), pages.stride(1)), block_table.stride(0),
               (out.stride(0), out.stride(1)), (0, lse.stride(0), lse.stride(2), lse.stride(1)),
               (part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1)))
    fp8 = kv_dtype == hd.FP8_DTYPE
    scale_or_state = torch.ones(1, dtype=torch.float32) if fp8 else work_state
    row_tiles = -(-q_len * heads // hd.BLOCK_M.value)
    arguments = [q, *hd.chunk_descriptors(pages, kv_lora_rank), scale_or_state, block_table, seqlens, work, out, lse,
                 part_out, part_lse, 0.1, *strides, work_state, 1000, row_tiles, merge_state, pages, pages.stride(1)]
    constants = dict(HEADS=heads, PAGE_SIZE=page_size, KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim, MERGE=merge,
                     SHARES_TO_COMBINE=merge and hd.dispatch.SHARE_MERGES_BY_COMBINE,
                     EVICT_FIRST=streams_evict_first(row_tiles), E4M3_SCORES=e4m3_scores,
                     PREFETCH_PAIRS=hd.dispatch.prefetch_pairs(kv_dtype == hd.FP8_DTYPE),
                     LEFT_SCORES_AHEAD=hd.dispatch.left_scores_ahead(row_tiles, fp8),
                     num_warps=4)
    return arguments, constants


def narrow_arguments(heads: int, q_len: int, page_size: int = 64, kv_lora_rank: int = 512,
                     rope_dim: int = 64, e4m3_scores: bool = False,
                     rows: int = nd.ROWS.value) -> tuple[list[object], dict[str, object]]:
    """Stand-ins for the narrow fp8 kernel's arguments and constants (`hopper_narrow_decode.prepare`'s launch over
    tiles of `rows` query rows): the seesaw's over fp8 pages, with the narrow kernel's TMA boxes."""
    seesaw, _ = seesaw_arguments(heads, q_len, hd.FP8_DTYPE, False, page_size=page_size, kv_lora_rank=kv_lora_rank,
                                 rope_dim=rope_dim,
                                 part_dtype=torch.float16 if triton_decode.NARROW_FP16_PARTIALS else torch.float32)
    pages = torch.empty(256, page_size, kv_lora_rank + rope_dim, dtype=hd.FP8_DTYPE)
    descriptors = row_descriptors(pages, nd.tma_boxes(page_size, kv_lora_rank, rope_dim))
    row_tiles = -(-q_len * heads // rows)
    constants = dict(HEADS=heads, PAGE_SIZE=page_size, KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim, ROWS=rows,
                     EVICT_FIRST=streams_evict_first(row_tiles), E4M3_SCORES=e4m3_scores, num_warps=nd.NUM_WARPS)
    # The seesaw's from its scale on, up to its plan state (the narrow kernel takes no persistent plan).
    return [seesaw[0], *descriptors, *seesaw[3:18]], constants


def split_arguments(heads: int, q_len: int, kv_dtype: torch.dtype, page_size: int = 16, kv_lora_rank: int = 512,
                    rope_dim: int = 64) -> tuple[object, list[object], dict[str, object]]:
    """The split kernel `hopper_decode.prepare` launches for pages the seesaw does not take (the cp.async kernel for
    16-bit pages, the fp8 kernel for fp8 ones), with stand-ins for its arguments and its constants: the seesaw's
    with the pages in place of the descriptors, the scale for fp8 pages only, up to its plan state."""
    seesaw, _ = seesaw_arguments(heads, q_len, kv_dtype, False, page_size=page_size, kv_lora_rank=kv_lora_rank,
                                 rope_dim=rope_dim)
    pages = torch.empty(256, page_size, kv_lora_rank + rope_dim, dtype=kv_dtype)
    constants = dict(HEADS=heads, PAGE_SIZE=page_size, KV_LORA_RANK=kv_lora_rank, ROPE_DIM=rope_dim)
    if kv_dtype == hd.FP8_DTYPE:
        return hd.mla_decode_hopper_fp8_kernel, [seesaw[0], pages, *seesaw[3:18]], {**constants, "num_warps": 4}
    return (hd.mla_decode_hopper_split_kernel, [seesaw[0], pages, *seesaw[4:18]],
            {**constants, "num_warps": hd.NUM_WARPS.value})


def plan_arguments(lengths: list[int], heads: int, q_len: int, shares: bool = True, num_sms: int = 132
                   ) -> tuple[list[object], dict[str, object]]:
    """The arguments and constants of the split-plan kernel (`decode_split_plan._split_counts_kernel`) that
    `plan_decode` launches for a Hopper-tier plan of `lengths` (CPU tensors) over pages of 64 tokens, recorded
    instead of launched; with `shares`, equal shares compiled in whichever Triton builds it."""
    recorded: list[object] = []

    class Recorder:
        """Stands in for the kernel: `kernel[grid](*args, **constants)` records its arguments."""

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            return lambda *args, **constants: recorded.extend([list(args), constants])

    shares_from = ("",) if shares else ("none",)
    with (mock.patch.object(decode_split_plan, "_split_counts_kernel", Recorder()),
          mock.patch.object(decode_split_plan, "SHARE_PLAN_TRITONS", shares_from),
          mock.patch.object(decode_split_plan, "INTERPRET", False),
          mock.patch.object(triton_decode, "INTERPRET", False),
          mock.patch.object(triton_decode.hopper_common, "serves", lambda device, kv_dtype: True)):
        triton_decode.plan_decode(torch.tensor(lengths, dtype=torch.int32), q_len=q_len, heads=heads,
                                  num_sms=num_sms, page_size=64)
    return recorded[0], recorded[1]


# Plans whose kernel builds differ: (name, lengths, heads, shares). 24 sequences reduce with REDUX, 8 (BLOCK_B 16)
# with shuffles; at 16 heads (one row tile) shares are on and ragged shares off.
PLANS = [("24 x 128h", [16384] * 24, 128, True), ("24 x 128h no shares", [16384] * 24, 128, False),
         ("8 x 128h", [16384] * 8, 128, True), ("24 x 16h", [16384] * 24, 16, True),
         ("100 x 128h", [16384] * 100, 128, True)]


def compile_plan(lengths: list[int], heads: int, shares: bool, details: Details = Details()) -> str:
    """`report` of the plan kernel as `plan_arguments` records its launch (one query token a sequence)."""
    arguments, constants = plan_arguments(lengths, heads, 1, shares)
    return report(lambda: compile_like_launch(decode_split_plan._split_counts_kernel, arguments, constants), details)


def _plan_main(details: Details) -> bool:
    """The split-plan kernel of each of PLANS; whether one failed or holds a predicated warp collective
    (`predicated_warp_collectives`)."""
    failed = False
    for name, lengths, heads, shares in PLANS:
        line = compile_plan(lengths, heads, shares, details)
        failed |= line.startswith("FAILED") or not line.split("\n")[0].endswith("predicated warp collectives 0")
        print(f"plan {name}: {line}")
    return failed


def _narrow_main(heads_list: str, q_lens: str, details: Details) -> bool:
    """The narrow fp8 kernel for each head count and q_len with at most its 32 rows, page sizes 16 and 64, in 16-row
    tiles and, with e4m3 scores over more than 16 rows, in 32-row ones; whether one failed."""
    failed = False
    for heads, q_len, page_size, e4m3 in itertools.product(map(int, heads_list.split(",")),
                                                           map(int, q_lens.split(",")), (16, 64), (False, True)):
        if heads * q_len > nd.MAX_ROWS:
            continue
        wide = e4m3 and heads * q_len > nd.ROWS.value
        for rows in (nd.ROWS.value, nd.E4M3_ROWS.value) if wide else (nd.ROWS.value,):
            arguments, constants = narrow_arguments(heads, q_len, page_size, e4m3_scores=e4m3, rows=rows)
            with nd.NARROW.compiling():
                line = report(lambda: compile_like_launch(nd.mla_decode_hopper_narrow_fp8_kernel, arguments,
                                                          constants), details)
            failed |= line.startswith("FAILED")
            print(f"narrow heads {heads} q_len {q_len} rows {rows} page {page_size} e4m3 S {e4m3}: {line}")
    return failed


def _split_main(heads_list: str, q_lens: str, kv_dtype: torch.dtype, details: Details) -> bool:
    """The split kernel of `kv_dtype` pages (`split_arguments`) for each head count and q_len, page sizes 16 and 32;
    whether one failed."""
    failed = False
    for heads, q_len, page_size in itertools.product(map(int, heads_list.split(",")), map(int, q_lens.split(",")),
                                                     (16, 32)):
        kernel, arguments, constants = split_arguments(heads, q_len, kv_dtype, page_size)
        line = report(lambda: compile_like_launch(kernel, arguments, constants), details)
        failed |= line.startswith("FAILED")
        print(f"{kernel.__name__} heads {heads} q_len {q_len} page {page_size}: {line}")
    return failed


def _prefill_main(dims: str, block_ns: str, stage_counts: str, kernel_name: str, details: Details,
                  dtype: torch.dtype = torch.bfloat16) -> bool:
    """Every prefill configuration of the grid for `dtype` operands; whether one failed."""
    failed = False
    for spec, block_n, stages in itertools.product(dims.split(";"), map(int, block_ns.split(",")),
                                                   map(int, stage_counts.split(","))):
        nope, rope, v_dim = map(int, spec.split(","))
        shape = f"nope {nope} rope {rope} v {v_dim} block_n {block_n} stages {stages}"
        if hp.shared_bytes(nope, rope, v_dim, block_n, stages, dtype.itemsize) > hp.SHARED_MEMORY_LIMIT or stages < 2:
            print(f"{shape}: refused by plan_launch (stages < 2 or shared memory over {hp.SHARED_MEMORY_LIMIT} B)")
            continue
        for kernel, causal, merge in itertools.product(list(KERNELS) if kernel_name == "both" else [kernel_name],
                                                       (True, False), (False, True)):
            line = compile_one(nope, rope, v_dim, block_n, stages, causal, merge, dtype, kernel, details)
            failed |= line.startswith("FAILED")
            print(f"{kernel} {shape} causal {causal} merge {merge}: {line}")
    return failed


def _seesaw_main(heads_list: str, q_lens: str, details: Details) -> bool:
    """The decode seesaw for each head count and q_len, 16-bit and fp8 pages (S in fp16 and in e4m3), with and without
    the in-kernel merge, with the partials a bf16 output gets and with float32 ones (an fp16 output's over fp8 pages,
    or `SEESAW_16BIT_PARTIALS` off); whether one failed."""
    failed = False
    pages = ((torch.bfloat16, False), (hd.FP8_DTYPE, False), (hd.FP8_DTYPE, True))
    for heads, q_len, (kv_dtype, e4m3), merge, part_dtype in itertools.product(
            map(int, heads_list.split(",")), map(int, q_lens.split(",")), pages, (True, False), (None, torch.float32)):
        arguments, constants = seesaw_arguments(heads, q_len, kv_dtype, merge, e4m3_scores=e4m3, part_dtype=part_dtype)
        with hd.SEESAW.compiling():
            line = report(lambda: compile_like_launch(hd.mla_decode_hopper_seesaw_kernel, arguments, constants),
                          details)
        failed |= line.startswith("FAILED")
        parts = "float32" if part_dtype else "as a bf16 output's"
        print(f"seesaw heads {heads} q_len {q_len} {str(kv_dtype).removeprefix('torch.')} e4m3 S {e4m3} merge {merge} "
              f"partials {parts} "
              f"evict-first {constants['EVICT_FIRST']}: {line}")
    return failed


@click.command()
@click.option("--dims", default="128,64,128;64,32,64", show_default=True, help="prefill: nope,rope,v sets, ';'-separated")
@click.option("--block-n", "block_ns", default="64,128", show_default=True, help="prefill: key tile widths")
@click.option("--stages", "stage_counts", default="2,3", show_default=True, help="prefill: ring depths")
@click.option("--heads", "heads_list", default="128,16", show_default=True, help="decode kernels: head counts")
@click.option("--q-lens", "q_lens", default="1", show_default=True, help="decode kernels: query tokens per sequence")
@click.option("--kernel", "kernel_name",
              type=click.Choice([*KERNELS, "both", "seesaw", "narrow", "split", "fp8_split", "plan"]),
              default="hopper", show_default=True)
@click.option("--fp8", is_flag=True, help="prefill: e4m3 operands (v transposed) instead of bf16")
@click.option("--where-spills", is_flag=True, help="List the source lines of each configuration's spills (nvdisasm).")
@click.option("--loop-syncs", is_flag=True,
              help="List each configuration's innermost loops with their warpgroup syncs by source line (nvdisasm).")
@click.option("--scan-cache", "cache_folder", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Instead of compiling: every cubin of this Triton cache folder checked for predicated warp "
                   "collectives (fails on one, or on none found).")
def main(dims: str, block_ns: str, stage_counts: str, heads_list: str, q_lens: str, kernel_name: str, fp8: bool,
         where_spills: bool, loop_syncs: bool, cache_folder: Path | None) -> None:
    print(f"triton {triton.__version__}")
    details = Details(where_spills, loop_syncs)
    if cache_folder is not None:
        found = scan_cache(cache_folder)
        for name, predicated in found.items():
            print(f"{name}: {predicated_summary(predicated)}")
        failed = not found or any(found.values())
        print(f"{len(found)} kernels, {sum(map(bool, found.values()))} with predicated warp collectives")
    elif kernel_name == "seesaw":
        failed = _seesaw_main(heads_list, q_lens, details)
    elif kernel_name == "narrow":
        failed = _narrow_main(heads_list, q_lens, details)
    elif kernel_name == "plan":
        failed = _plan_main(details)
    elif kernel_name in ("split", "fp8_split"):
        failed = _split_main(heads_list, q_lens, hd.FP8_DTYPE if kernel_name == "fp8_split" else torch.bfloat16,
                             details)
    else:
        failed = _prefill_main(dims, block_ns, stage_counts, kernel_name, details,
                               hd.FP8_DTYPE if fp8 else torch.bfloat16)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
