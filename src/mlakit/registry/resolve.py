"""resolve(): a serving configuration checked against every backend record, at start-up.

Rules:
- an explicitly named backend that does not fit is an error, never swapped for another;
- an explicit page size or KV dtype a chosen backend cannot take is an error naming the
  allowed values; unset ones are chosen to fit both backends, and the choice is noted;
- a decode-only backend named through `attention_backend` gets an automatic prefill
  backend (its declared fallback first), noted; naming it as `prefill_backend` is an error;
  so does a backend whose prefill kernel mlakit has no adapter for yet;
- speculative decoding a decode backend cannot do is refused here: more draft tokens than
  its decode takes, tree drafts (speculative_eagle_topk > 1) without a tree mask, uneven
  draft lengths without a latent extend; the plan notes the speculative mode it serves;
- "auto" takes the registered backends in `auto_rank` order (hardware-specific kernels
  first, the reference last) and notes why each higher-ranked one was skipped;
- decode context parallelism (`dcp_size > 1`) needs a decode backend that returns the lse and
  takes the whole DCP group's heads per call, and a page size that is a multiple of
  `dcp_interleave` (so one page table can serve every rank of a DCP group, as in vLLM).
"""

from __future__ import annotations

import dataclasses
import math

from mlakit.config import AUTO, ServingConfig
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError
from mlakit.plan import Plan, WorkspaceRequest
from mlakit.registry.catalog import all_records, get_backend, missing_adapter, runnable_problems
from mlakit.registry.fit import Requirements, common_kv_dtypes, common_page_sizes
from mlakit.registry.records import BackendRecord, Phase, WorkspaceInputs
from mlakit.shape import MLAShape


def resolve(config: ServingConfig, shape: MLAShape, device: DeviceInfo | None = None) -> Plan:
    """Checks `config` for `shape` on `device` (default: detected from `config.device`).

    Returns a Plan, or raises one ConfigError listing, per backend considered, why it
    does not fit and what to change.

    >>> plan = resolve(ServingConfig(), MLAShape.preset("deepseek-v2-lite"), DeviceInfo.from_arch("cpu"))
    >>> plan.decode_backend, plan.page_size, plan.kv_cache_dtype
    ('reference', 64, 'bf16')
    """
    for name, value, kind in (("config", config, ServingConfig), ("shape", shape, MLAShape)):
        if not isinstance(value, kind):
            raise ConfigError(f"{name}: expected a {kind.__name__}, got {type(value).__name__}")
    if device is not None and not isinstance(device, DeviceInfo):
        raise ConfigError(f"device: expected a DeviceInfo (e.g. DeviceInfo.from_arch('sm90')) or None, "
                          f"got {type(device).__name__}")
    device = device or DeviceInfo.detect(config.device)
    rank_shape = shape.for_tp(config.tp_size)
    if config.cuda_graphs and device.kind != "cuda":
        raise ConfigError(f"cuda_graphs=True needs a CUDA device; the device is {device.arch}. Set cuda_graphs off.")
    req = Requirements(
        device=device,
        shape=rank_shape,
        page_size=config.page_size,
        kv_dtype=None if config.kv_cache_dtype == AUTO else config.kv_cache_dtype,
        decode_q_len=config.decode_q_len,
        speculative_eagle_topk=config.speculative_eagle_topk,
        speculative_uneven_drafts=config.speculative_uneven_drafts,
        cuda_graphs=bool(config.cuda_graphs),
        dcp_size=config.dcp_size,
    )
    notes: list[str] = []
    if config.tp_size > 1:
        notes.append(f"heads per rank: {rank_shape.num_heads} ({shape.num_heads} heads / tp_size {config.tp_size})")
    interleave = config.dcp_interleave if config.dcp_size > 1 else 1

    prefill_explicit = config.prefill_backend is not None and config.prefill_backend != AUTO
    decode_explicit = config.requested_decode_backend != AUTO
    if prefill_explicit and not decode_explicit:
        prefill = _choose("prefill", config.prefill_backend, req, None, notes)
        decode = _choose("decode", AUTO, req, prefill, notes)
    else:
        decode = _choose("decode", config.requested_decode_backend, req, None, notes)
        prefill = _choose_prefill(config, decode, req, notes)
    _note_speculative_mode(config, decode, prefill, notes)

    page_size = _choose_page_size(decode, prefill, req, notes, interleave)
    kv_dtype = _choose_kv_dtype(decode, prefill, req, notes)
    cuda_graphs = _choose_cuda_graphs(config, decode, device, notes)
    _note_backend_caveats(device, (prefill, decode), notes)
    _note_dcp(config, rank_shape, decode, notes)
    # Under DCP a decode call runs the whole DCP group's heads: size the workspaces for that many.
    call_shape = dataclasses.replace(rank_shape, num_heads=rank_shape.num_heads * config.dcp_size)
    inputs = WorkspaceInputs(call_shape, device, page_size, config.max_batch_size, config.max_context_len, config.decode_q_len)
    return Plan(
        model_shape=shape,
        rank_shape=rank_shape,
        tp_size=config.tp_size,
        device=device,
        prefill_backend=prefill.name,
        decode_backend=decode.name,
        page_size=page_size,
        kv_cache_dtype=kv_dtype,
        decode_q_len=config.decode_q_len,
        cuda_graphs=cuda_graphs,
        max_batch_size=config.max_batch_size,
        max_context_len=config.max_context_len,
        workspaces=_workspaces((prefill, decode), inputs),
        notes=tuple(notes),
        dcp_size=config.dcp_size,
        dcp_interleave=config.dcp_interleave,
    )


def _choose(phase: Phase, requested: str, req: Requirements, partner: BackendRecord | None, notes: list[str]) -> BackendRecord:
    if requested != AUTO:
        record = get_backend(requested).record
        problems = runnable_problems(record, phase, dataclasses.replace(req, named=True), partner)
        if problems:
            raise ConfigError(
                f"{phase}_backend {requested!r} cannot serve this configuration on {req.device.arch}:\n"
                + _bullets(problems)
                + "\n"
                + _alternatives(phase, req, partner)
            )
        coarser = f"; its attention computes in {record.attention_dtype}" if record.attention_dtype else ""
        notes.append(f"{phase} backend: {record.name} (as configured{coarser})")
        return record
    return _choose_auto(phase, req, partner, notes, reason="auto")


def _choose_auto(phase: Phase, req: Requirements, partner: BackendRecord | None, notes: list[str], reason: str) -> BackendRecord:
    skipped: list[str] = []
    other_hardware: list[str] = []
    for record in all_records():
        problems = runnable_problems(record, phase, req, partner)
        if not problems:
            note = f"{phase} backend: {record.name} ({reason}: highest-priority backend that fits {req.device.arch})"
            if skipped:
                note += "; skipped " + "; ".join(skipped)
            if other_hardware:
                note += f"; not for {req.device.arch}: {', '.join(other_hardware)}"
            notes.append(note)
            return record
        if record.hardware_problems(req.device):
            other_hardware.append(record.name)
        else:
            skipped.append(f"{record.name} ({problems[0]})")
    per_backend = "\n".join(
        f"  {r.name}:\n" + _bullets(runnable_problems(r, phase, req, partner), indent="    ") for r in all_records()
    )
    raise ConfigError(f"no registered backend can serve {phase} for this configuration on {req.device.arch}:\n{per_backend}")


def _choose_prefill(config: ServingConfig, decode: BackendRecord, req: Requirements, notes: list[str]) -> BackendRecord:
    requested = config.requested_prefill_backend
    inherited = config.prefill_backend is None or config.prefill_backend == AUTO
    if requested != AUTO and not inherited:
        return _choose("prefill", requested, req, decode, notes)
    if requested != AUTO and "prefill" in get_backend(requested).record.phases and not missing_adapter(requested, "prefill"):
        return _choose("prefill", requested, req, decode, notes)
    coarser = decode.attention_dtype is not None
    if "prefill" in decode.phases and not coarser and not runnable_problems(decode, "prefill", req, decode):
        notes.append(f"prefill backend: {decode.name} (same backend as decode)")
        return decode
    if decode.prefill_fallback is not None:
        fallback = get_backend(decode.prefill_fallback).record
        problems = runnable_problems(fallback, "prefill", req, decode)
        if not problems:
            notes.append(f"prefill backend: {fallback.name} ({decode.name} is decode-only; this is its declared prefill fallback)")
            return fallback
        notes.append(f"{decode.name}'s prefill fallback {fallback.name} does not fit ({problems[0]}); choosing automatically")
    if "prefill" not in decode.phases:
        reason = f"automatic, {decode.name} is decode-only"
    elif missing_adapter(decode.name, "prefill"):
        reason = f"automatic, mlakit has no adapter for {decode.name}'s prefill kernel yet"
    elif coarser:
        reason = (f"automatic, {decode.name}'s attention computes in {decode.attention_dtype}: its prefill runs only "
                  "where prefill_backend names it")
    else:
        reason = "auto"
    return _choose_auto("prefill", req, decode, notes, reason=reason)


def _choose_page_size(
    decode: BackendRecord, prefill: BackendRecord, req: Requirements, notes: list[str], interleave: int
) -> int:
    if req.page_size is not None:
        if req.page_size % interleave:
            raise ConfigError(
                f"page_size={req.page_size} is not a multiple of dcp_interleave={interleave}: a page must hold whole "
                f"interleave blocks of a rank's tokens; set page_size to a multiple of {interleave} or dcp_interleave "
                f"to a divisor of {req.page_size}"
            )
        return req.page_size
    takers = " and ".join(f"{r.name} {r.page_sizes.describe()}" for r in dict.fromkeys((decode, prefill)))
    lcm = math.lcm(interleave, decode.page_sizes.multiple_of, prefill.page_sizes.multiple_of)
    fitting = [p for p in common_page_sizes(decode, prefill) + common_page_sizes(decode, prefill, lcm) if p % interleave == 0]
    if not fitting:
        raise ConfigError(
            f"no page size that {takers} take is a multiple of dcp_interleave={interleave}; "
            f"set dcp_interleave to a divisor of one of their page sizes"
        )
    page_size = fitting[0]
    multiple = f", a multiple of dcp_interleave {interleave}" if interleave > 1 else ""
    notes.append(f"page_size: {page_size} (chosen: first size that {takers} take{multiple}, the decode backend's preference first)")
    return page_size


def _note_dcp(config: ServingConfig, rank_shape: MLAShape, decode: BackendRecord, notes: list[str]) -> None:
    dcp = config.dcp_size
    if dcp == 1:
        return
    notes.append(
        f"decode context parallelism: dcp_size {dcp}, {config.tp_size // dcp} DCP group(s) of {dcp} consecutive TP ranks; "
        f"each rank caches the "
        f"tokens at positions p with (p // {config.dcp_interleave}) % {dcp} == its DCP rank (about 1/{dcp} of every "
        f"sequence); {decode.name} decodes the group's {rank_shape.num_heads * dcp} heads ({rank_shape.num_heads} per rank "
        f"x {dcp}) over the rank's shard, one single-token row per query token, so causal masking stays by global "
        "position; per layer: an all-gather of the queries and an all-to-all of the partial outputs and lse "
        "(mlakit.distributed)"
    )


def _choose_kv_dtype(decode: BackendRecord, prefill: BackendRecord, req: Requirements, notes: list[str]) -> str:
    if req.kv_dtype is not None:
        return req.kv_dtype
    kv_dtype = common_kv_dtypes(decode, prefill)[0]
    takers = " and ".join(r.name for r in dict.fromkeys((decode, prefill)))
    notes.append(f"kv_cache_dtype: {kv_dtype} (auto: first of bf16, fp16, fp8_e4m3 that {takers} take)")
    return kv_dtype


def _choose_cuda_graphs(config: ServingConfig, decode: BackendRecord, device: DeviceInfo, notes: list[str]) -> bool:
    if config.cuda_graphs is not None:
        return config.cuda_graphs
    if device.kind != "cuda":
        notes.append(f"cuda_graphs: off (auto: the device is {device.kind})")
        return False
    if not decode.cuda_graphs:
        notes.append(f"cuda_graphs: off (auto: {decode.name} cannot be captured)")
        return False
    notes.append(f"cuda_graphs: on (auto: {decode.name} supports capture)")
    return True


def _note_speculative_mode(config: ServingConfig, decode: BackendRecord, prefill: BackendRecord, notes: list[str]) -> None:
    drafts = config.speculative_num_draft_tokens
    if drafts == 0:
        return
    draft_extend = f"{decode.name}'s latent extend" if decode.latent_extend else f"{prefill.name}'s prefill"
    uneven = f"through {decode.name}'s latent extend" if config.speculative_uneven_drafts else "off"
    notes.append(
        f"speculative decoding: chain drafts (topk 1), target verify with {drafts} draft token{'s' if drafts > 1 else ''} "
        f"({drafts + 1} query tokens per sequence) through {decode.name}'s decode kernel; draft decode steps: q_len 1; "
        f"draft extend: {draft_extend}; uneven drafts: {uneven}"
    )


def _note_backend_caveats(device: DeviceInfo, chosen: tuple[BackendRecord, ...], notes: list[str]) -> None:
    for record in dict.fromkeys(chosen):
        if not device.local and (missing := record.missing_packages()):
            notes.append(f"{record.name} needs {', '.join(missing)} on the target machine (not installed here): {record.install_hint}")
        if record.name == "reference" and device.kind != "cpu":
            notes.append("reference is the exact torch oracle and slow; install a faster backend for serving")


def _workspaces(chosen: tuple[BackendRecord, ...], inputs: WorkspaceInputs) -> tuple[WorkspaceRequest, ...]:
    by_family: dict[str, WorkspaceRequest] = {}
    for record in dict.fromkeys(chosen):
        spec = record.workspace
        if spec is None:
            continue
        nbytes = spec.size_bytes(inputs)
        current = by_family.get(spec.family)
        if current is None:
            by_family[spec.family] = WorkspaceRequest(spec.family, (record.name,), nbytes, spec.zero_filled, spec.formula)
        else:
            by_family[spec.family] = dataclasses.replace(
                current, backends=(*current.backends, record.name), nbytes=max(current.nbytes, nbytes)
            )
    return tuple(by_family.values())


def _alternatives(phase: Phase, req: Requirements, partner: BackendRecord | None) -> str:
    fitting = [r.name for r in all_records() if not runnable_problems(r, phase, req, partner)]
    if fitting:
        return f"backends that fit this {phase} configuration: {', '.join(fitting)}"
    return f"no registered backend fits this {phase} configuration as it stands; change the settings above"


def _bullets(lines: list[str], indent: str = "  ") -> str:
    return "\n".join(f"{indent}- {line}" for line in lines)

