"""Does a backend fit a set of requirements? Every reason it does not, each with its fix."""

from __future__ import annotations

import dataclasses
import math

from mlakit.device import DeviceInfo
from mlakit.registry.records import KV_DTYPES, PAGE_SIZE_PREFERENCE, BackendRecord, Phase
from mlakit.shape import MLAShape


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What a configuration (or one call's tensors) fixes. None means "not fixed, choose".

    `speculative_eagle_topk > 1` is tree drafts (decode needs a per-sequence tree mask);
    `speculative_uneven_drafts` is verify with uneven draft lengths (needs a latent extend).
    `dcp_size > 1` (decode context parallelism) makes each decode call run the heads of the
    whole DCP group (`shape.num_heads * dcp_size`) and merge partial results by their lse.
    `named`: the backend was asked for by name (see `BackendRecord.cpu_interpreter`).
    """

    device: DeviceInfo
    shape: MLAShape
    page_size: int | None = None
    kv_dtype: str | None = None
    decode_q_len: int = 1
    speculative_eagle_topk: int = 1
    speculative_uneven_drafts: bool = False
    cuda_graphs: bool = False
    needs_lse: bool = False
    dcp_size: int = 1
    named: bool = False


def common_page_sizes(a: BackendRecord, b: BackendRecord, fixed: int | None = None) -> list[int]:
    """Page sizes both backends take, in preference order (only `fixed` when it is set)."""
    if fixed is not None:
        candidates = [fixed]
    else:
        listed = sorted((a.page_sizes.sizes or frozenset()) | (b.page_sizes.sizes or frozenset()))
        shared_multiple = math.lcm(a.page_sizes.multiple_of, b.page_sizes.multiple_of)
        candidates = [a.preferred_page_size, b.preferred_page_size, *PAGE_SIZE_PREFERENCE, *listed, shared_multiple]
    return list(dict.fromkeys(p for p in candidates if a.page_sizes.accepts(p) and b.page_sizes.accepts(p)))


def common_kv_dtypes(decode: BackendRecord, prefill: BackendRecord, fixed: str | None = None) -> list[str]:
    """KV dtypes the decode backend's decode and the prefill backend's prefill both take, in preference order
    (bf16, fp16, fp8_e4m3)."""
    candidates = [fixed] if fixed is not None else list(KV_DTYPES)
    return [d for d in candidates if d in decode.kv_dtypes_for("decode") and d in prefill.kv_dtypes_for("prefill")]


def backend_problems(record: BackendRecord, phase: Phase, req: Requirements, partner: BackendRecord | None = None) -> list[str]:
    """Why `record` cannot serve `phase` under `req` (empty when it can).

    `partner` is the backend already chosen for the other phase: the two must share a
    page size and a KV dtype, since they read the same cache.
    """
    problems: list[str] = []
    if phase not in record.phases:
        fallback = f"; its declared prefill fallback is {record.prefill_fallback}" if record.prefill_fallback else ""
        problems.append(f"does not do {phase} (it is {'/'.join(sorted(record.phases))} only{fallback})")
    problems += record.hardware_problems(req.device, named=req.named)
    if req.device.local and (missing := record.missing_packages()):
        problems.append(f"needs package {', '.join(missing)}, not installed here ({record.install_hint})")
    if req.page_size is not None and not record.page_sizes.accepts(req.page_size):
        problems.append(f"page_size {req.page_size} is not supported; allowed page sizes: {record.page_sizes.describe()}")
    phase_kv_dtypes = record.kv_dtypes_for(phase)
    if req.kv_dtype is not None and req.kv_dtype not in phase_kv_dtypes:
        allowed = [d for d in KV_DTYPES if d in phase_kv_dtypes]
        in_phase = f" in {phase}" if phase_kv_dtypes != record.kv_dtypes else ""
        problems.append(f"kv_cache_dtype {req.kv_dtype!r} is not supported{in_phase}; allowed: {allowed}")
    for dtype, floor in record.kv_dtype_min_capability:
        capability = req.device.compute_capability
        if req.kv_dtype == dtype and capability is not None and capability < floor:
            problems.append(
                f"kv_cache_dtype {dtype!r} needs compute capability >= {floor[0]}.{floor[1]}, the device is {req.device.arch}"
            )
    if phase == "decode" and record.max_decode_q_len is not None and req.decode_q_len > record.max_decode_q_len:
        limit = (
            "no speculative decoding (1 query token per sequence)"
            if record.max_decode_q_len == 1
            else f"at most {record.max_decode_q_len} query tokens per sequence ({record.max_decode_q_len - 1} draft tokens)"
        )
        problems.append(
            f"speculative_num_draft_tokens={req.decode_q_len - 1} ({req.decode_q_len} query tokens per sequence "
            f"in decode) is not supported; it takes {limit}"
        )
    if phase == "decode" and req.speculative_eagle_topk > 1 and not record.tree_drafts:
        problems.append(
            f"speculative_eagle_topk={req.speculative_eagle_topk} (tree drafts) is not supported; it verifies chains only (topk 1)"
        )
    if phase == "decode" and req.speculative_uneven_drafts and not record.latent_extend:
        problems.append("speculative_uneven_drafts needs a latent-form extend kernel, which it lacks")
    if phase == "decode" and req.dcp_size > 1 and not record.returns_lse:
        problems.append(
            f"does not return the log-sum-exp, which dcp_size={req.dcp_size} needs to merge the ranks' partial results; "
            "pick a decode backend that returns lse or set dcp_size=1"
        )
    problems += _shape_problems(record, req.shape, req.dcp_size if phase == "decode" else 1, phase == "prefill")
    if phase == "decode" and req.cuda_graphs and not record.cuda_graphs:
        problems.append("cannot be captured in a CUDA graph; set cuda_graphs off or pick a backend that can")
    if req.needs_lse and not record.returns_lse:
        problems.append("does not return the log-sum-exp; ask without lse or pick a backend that returns it")
    if partner is not None and partner.name != record.name:
        if not common_page_sizes(record, partner, req.page_size):
            problems.append(
                f"shares no page size with {partner.name} ({record.page_sizes.describe()} vs {partner.page_sizes.describe()})"
            )
        other: Phase = "prefill" if phase == "decode" else "decode"
        decode, prefill = (record, partner) if phase == "decode" else (partner, record)
        if not common_kv_dtypes(decode, prefill, req.kv_dtype):
            problems.append(f"shares no KV dtype with {partner.name} ({sorted(phase_kv_dtypes)} vs "
                            f"{sorted(partner.kv_dtypes_for(other))})")
    return problems


def _shape_problems(record: BackendRecord, shape: MLAShape, dcp_size: int, prefill: bool) -> list[str]:
    problems = []
    if record.max_heads is not None and shape.num_heads * dcp_size > record.max_heads:
        if dcp_size == 1:
            problems.append(
                f"takes at most {record.max_heads} heads per rank, got {shape.num_heads}; raise tp_size so heads per rank fit"
            )
        else:
            problems.append(
                f"takes at most {record.max_heads} heads per call, got {shape.num_heads * dcp_size} ({shape.num_heads} heads "
                f"per rank x dcp_size {dcp_size}: DCP decodes its whole group's heads); raise tp_size or lower dcp_size"
            )
    if record.kv_lora_ranks is not None and shape.kv_lora_rank not in record.kv_lora_ranks:
        problems.append(f"kv_lora_rank {shape.kv_lora_rank} is not supported; allowed: {sorted(record.kv_lora_ranks)}")
    widths = [("qk_rope_head_dim", record.rope_dims)]
    if prefill:  # the MHA form's per-head widths; decode reads the latent rows
        widths += [("qk_nope_head_dim", record.qk_nope_dims), ("v_head_dim", record.v_dims)]
    for name, allowed in widths:
        if allowed is not None and getattr(shape, name) not in allowed:
            problems.append(f"{name} {getattr(shape, name)} is not supported; allowed: {sorted(allowed)}")
    return problems
