"""Decode backends side by side, each called the way its own API intends in a serving step: the
per-step metadata (ours from `mla_decode_metadata`, the call `mla_decode`; FlashMLA's schedule
from `get_mla_metadata`, FlashInfer's `plan()` on a CUDA-graph wrapper) is built before the timed
call, and only the kernel launches are timed. `mlakit bench decode --backends` uses these."""

from __future__ import annotations

import torch

from mlakit.attention.functional import mla_decode, mla_decode_metadata
from mlakit.bench.decode import DIM, KV_LORA_RANK, ROPE_DIM, CaseNotSupported, DecodeCase, DecodeInputs, KernelFactory
from mlakit.cache.kv_quant import storage_name
from mlakit.device import DeviceInfo
from mlakit.errors import ConfigError
from mlakit.registry.catalog import all_records, get_backend, runnable_problems
from mlakit.registry.fit import Requirements
from mlakit.shape import MLAShape


def usable_decode_backends(device: DeviceInfo) -> list[str]:
    """Registered decode backends that run on `device` with their packages installed and return lse,
    in auto-selection order, reference excluded.

    >>> usable_decode_backends(DeviceInfo.from_arch("cpu"))
    []
    """
    return [
        r.name for r in all_records()
        if "decode" in r.phases and r.returns_lse and r.name != "reference" and not r.hardware_problems(device)
        and not r.missing_packages()
    ]


def case_problems(backend: str, case: DecodeCase, device: DeviceInfo) -> list[str]:
    """Why `backend` cannot run `case` here (empty when it can), in the registry's words.

    >>> case_problems("flashmla", DecodeCase(128, 1, 1024, page_size=16), DeviceInfo.from_arch("sm90"))[-1]
    'page_size 16 is not supported; allowed page sizes: {64}'
    """
    req = Requirements(
        device=device, shape=MLAShape.of_latent(case.heads, KV_LORA_RANK, ROPE_DIM), page_size=case.page_size,
        kv_dtype=case.kv_dtype, decode_q_len=case.q_len, needs_lse=True,
    )
    return runnable_problems(get_backend(backend).record, "decode", req)


def backend_kernel(backend: str, device: DeviceInfo) -> KernelFactory:
    """The timed call of `backend` for a batch; raises CaseNotSupported from the preparation for a case
    the backend's record refuses."""
    prepare_call = {"flashinfer_mla": _flashinfer_call, "flashmla": _flashmla_call}.get(backend) or _registry_call(backend)

    def prepare(inputs: DecodeInputs):
        problems = case_problems(backend, _case_of(inputs), device)
        if problems:
            raise CaseNotSupported("; ".join(problems))
        return prepare_call(inputs)

    return prepare


def _case_of(inputs: DecodeInputs) -> DecodeCase:
    batch, q_len, heads, _ = inputs.q.shape
    return DecodeCase(heads, batch, None, q_len, storage_name(inputs.kv_cache.dtype), inputs.kv_cache.shape[1])


def _registry_call(backend: str) -> KernelFactory:
    """`mla_decode` on `backend` with the step's metadata, as an engine's serving step calls it (told the batch's
    cached tokens, as an engine knows them on the host: `AttentionStep`'s `kv_tokens`, SGLang's `seq_lens_sum`)."""

    def prepare(inputs: DecodeInputs):
        _, q_len, heads, _ = inputs.q.shape
        metadata = mla_decode_metadata(inputs.cache_seqlens, q_len=q_len, heads=heads, backend=backend,
                                       kv_cache_dtype=_case_of(inputs).kv_dtype, page_size=inputs.kv_cache.shape[1],
                                       kv_tokens_hint=int(inputs.cache_seqlens.sum()))
        return lambda: mla_decode(
            inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens, softmax_scale=inputs.softmax_scale,
            backend=backend, kv_scale=inputs.kv_scale, kv_lora_rank=KV_LORA_RANK, check_inputs=False, metadata=metadata,
        )

    return prepare


def _flashmla_call(inputs: DecodeInputs):
    """FlashMLA's own API as its callers use it: a schedule from `get_mla_metadata`, filled by the first
    call (the untimed warm-up) and reused; the timed call is `flash_mla_with_kvcache` alone, its lse
    left as FlashMLA writes it (+inf for a query that sees no key; the adapter's -inf fix-up is an
    extra kernel FlashMLA's callers do not run)."""
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    _, q_len, heads, _ = inputs.q.shape
    schedule, num_splits = get_mla_metadata(inputs.cache_seqlens, q_len * heads, 1)
    k_cache = inputs.kv_cache.unsqueeze(2)
    return lambda: flash_mla_with_kvcache(
        inputs.q, k_cache, inputs.block_table, inputs.cache_seqlens, KV_LORA_RANK, schedule, num_splits,
        softmax_scale=inputs.softmax_scale, causal=True,
    )


def _flashinfer_call(inputs: DecodeInputs):
    """FlashInfer's wrapper in CUDA-graph mode (fixed index buffers), planned once for the batch; the
    timed call is `run()` alone, its lse left in FlashInfer's base 2."""
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    batch, q_len, heads, _ = inputs.q.shape
    device = inputs.q.device
    page_size = inputs.kv_cache.shape[1]
    lengths = inputs.cache_seqlens.long()
    pages_used = (lengths + page_size - 1) // page_size
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = pages_used.cumsum(0)
    in_use = torch.arange(inputs.block_table.shape[1], device=device)[None, :] < pages_used[:, None]
    kv_indices = inputs.block_table[in_use].contiguous()
    qo_indptr = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=device)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = BatchMLAPagedAttentionWrapper(
        workspace, use_cuda_graph=True, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
        kv_len_arr=inputs.cache_seqlens,
    )
    wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, inputs.cache_seqlens, heads, KV_LORA_RANK, ROPE_DIM, page_size, True,
        inputs.softmax_scale, inputs.q.dtype, inputs.kv_cache.dtype,
    )
    flat_q = inputs.q.reshape(batch * q_len, heads, DIM)
    q_nope, q_pe = flat_q[..., :KV_LORA_RANK], flat_q[..., KV_LORA_RANK:]
    ckv, kpe = inputs.kv_cache[..., :KV_LORA_RANK], inputs.kv_cache[..., KV_LORA_RANK:]
    out = torch.empty(batch * q_len, heads, KV_LORA_RANK, dtype=inputs.q.dtype, device=device)
    lse = torch.empty(batch * q_len, heads, dtype=torch.float32, device=device)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        wrapper.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse, return_lse=True)
        return out.view(batch, q_len, heads, KV_LORA_RANK), lse

    return call


def parse_backends(spec: str, device: DeviceInfo) -> tuple[list[str], list[str]]:
    """The backends of a `--backends` list that run here, and a note for each named one that does not.

    >>> parse_backends("triton", DeviceInfo.from_arch("xpu"))[1]
    ['triton: runs on cuda, not on xpu']
    """
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--backends: expected a comma-separated list of decode backends, got {spec!r}")
    usable, notes = [], []
    for name in names:
        record = get_backend(name).record
        problems = [] if "decode" in record.phases else ["has no decode kernel"]
        problems += record.hardware_problems(device) + [f"package {p} is not installed" for p in record.missing_packages()]
        if not record.returns_lse:
            problems.append("returns no lse")
        if problems:
            notes.append(f"{name}: {'; '.join(problems)}")
        else:
            usable.append(name)
    return usable, notes

