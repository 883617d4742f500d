"""Warm start: launch every kernel variant a plan can use, on small dummy data, before the
first request and before graph capture, so no request pays a JIT compile (or waits on
Triton's on-disk cache) and no scheduler watchdog fires on a first-request compile.

The calls go through the same public entry points a serving step uses (`mla_decode`,
`mla_extend`, `mla_prefill`, the cache write), with the plan's backends, page size, KV
dtype, heads per rank and latent widths, so they compile exactly the variants those steps
will ask for: decode at the plan's query length and at 1 (draft steps), with and without
the split combine, at batch 1 and every batch-size class of the split plan up to the plan's max
batch and the max batch itself (and again through step metadata hinting a large and a small batch, whose plans may
pick other tiles and kernel variants); each latent-extend length from 1, alone and at power-of-two sequence counts up
to the max batch (other split ceilings, merges and combine tilings); the causal, chunk and merge passes of the MHA
prefill.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from mlakit.attention.functional import mla_decode, mla_decode_metadata, mla_extend, mla_prefill
from mlakit.cache import LatentStore
from mlakit.device import kind_available
from mlakit.errors import ConfigError, is_int
from mlakit.kernels.seesaw_layout import decode_page_size_hint
from mlakit.plan import Plan, WarmupReport
from mlakit.prefill.metadata import plan_prefill
from mlakit.registry.catalog import get_backend
from mlakit.serving.step import DEFAULT_MAX_LATENT_EXTEND_TOKENS

LONG_SEQUENCE = 2048
# The hints of the warm-up's hinted decodes: past any kernel choice's threshold, above and below.
LARGE_BATCH_HINT = 1 << 40
SMALL_BATCH_HINT = 0
SPLIT_PLAN_BATCH_CLASSES = (16, 32, 64, 128, 256, 512, 1024)


def warm_up(
    plan: Plan, *, scale_layout: str = "tensor", max_latent_extend_tokens: int = DEFAULT_MAX_LATENT_EXTEND_TOKENS
) -> Plan:
    """Runs every kernel variant of `plan` once on its device; returns the plan with its `warmup` report.

    `scale_layout` is the fp8 cache's scale layout ("tensor" or "group"; ignored for 16-bit caches).

    >>> from mlakit import DeviceInfo, MLAShape, ServingConfig, resolve
    >>> plan = warm_up(resolve(ServingConfig(max_batch_size=4), MLAShape.preset("deepseek-v2-lite"), DeviceInfo.from_arch("cpu")))
    >>> plan.warmup.calls[:2]
    ('cache write', 'decode q_len 1, batch 1')
    """
    if not isinstance(plan, Plan):
        raise ConfigError(f"plan: expected a Plan (mlakit.resolve(...)), got {type(plan).__name__}")
    if not kind_available(plan.device.kind):
        raise ConfigError(f"plan: expected one for a device this machine has, got one for {plan.device.name} "
                          f"(no {plan.device.kind} device here); resolve it on the machine that serves")
    if not is_int(max_latent_extend_tokens) or max_latent_extend_tokens < 0:
        raise ConfigError(f"max_latent_extend_tokens: expected an integer >= 0, got {max_latent_extend_tokens!r}")
    began = time.perf_counter()
    calls: list[str] = []
    world = _DummyWorld(plan, scale_layout)
    world.write()
    calls.append("cache write")
    for q_len in dict.fromkeys((plan.decode_q_len, 1)):
        # The max batch too: the smallest split ceiling (where the Hopper kernel merges its own partials, the
        # share-only combine behind it).
        classes = (1, 2, *(b for b in SPLIT_PLAN_BATCH_CLASSES if b <= plan.max_batch_size), plan.max_batch_size)
        for batch in dict.fromkeys(classes):
            world.decode(batch, q_len)
            calls.append(f"decode q_len {q_len}, batch {batch}")
            if get_backend(plan.decode_backend).decode_metadata is not None:
                # A step's metadata carries its cached tokens (`StepPart.kv_tokens`): large ones may pick other tiles,
                # small ones other kernel variants.
                for size, hint in (("large", LARGE_BATCH_HINT), ("small", SMALL_BATCH_HINT)):
                    world.decode(batch, q_len, kv_tokens_hint=hint)
                    calls.append(f"decode q_len {q_len}, batch {batch}, metadata hinted a {size} batch")
    if get_backend(plan.decode_backend).extend is not None:  # else short extends run in MHA form
        # An extend's row tiles follow its longest segment, its split ceiling its sequences (hence whether the Hopper
        # kernel merges its own partials, and the combine's tiling): each length alone and at every power-of-two
        # sequence count up to the max batch.
        for new_tokens in range(1, max_latent_extend_tokens + 1):  # 1: a one-token prompt
            world.extend(new_tokens)
            calls.append(f"latent extend of {new_tokens} tokens")
            for sequences in _powers_of_two_up_to(plan.max_batch_size):
                world.extend(new_tokens, sequences=sequences)
                calls.append(f"latent extend of {new_tokens} tokens x {sequences} sequences")
    for chunk in (None, 512):
        world.prefill(chunk)
        calls.append("MHA prefill, one pass" if chunk is None else "MHA prefill, chunked prefix with merges")
    if world.device.type == "cuda":
        torch.cuda.synchronize(world.device)
    return dataclasses.replace(plan, warmup=WarmupReport(round(time.perf_counter() - began, 3), tuple(calls)))


def _powers_of_two_up_to(limit: int) -> list[int]:
    """2, 4, 8, ... up to `limit`, and `limit` itself.

    >>> _powers_of_two_up_to(20)
    [2, 4, 8, 16, 20]
    """
    counts = [2 ** k for k in range(1, max(1, limit).bit_length()) if 2 ** k < limit]
    return counts + [limit] if limit >= 2 else counts


class _DummyWorld:
    """A small cache in the plan's layout: one long sequence (so decode splits and combines) and a short one."""

    def __init__(self, plan: Plan, scale_layout: str) -> None:
        self.plan, shape = plan, plan.rank_shape
        self.device = plan.device.torch_device
        self.heads, self.rank, self.dim = shape.num_heads, shape.kv_lora_rank, shape.kv_cache_dim
        self.scale = shape.softmax_scale
        page = plan.page_size
        pages_per_sequence = -(-LONG_SEQUENCE // page)
        self.store = LatentStore(2 * pages_per_sequence, page, self.dim, dtype=plan.kv_cache_dtype, device=self.device,
                                 scale_layout=scale_layout)
        self.table = torch.arange(2 * pages_per_sequence, dtype=torch.int32, device=self.device).view(2, pages_per_sequence)
        self.lengths = torch.tensor([LONG_SEQUENCE, 5], dtype=torch.int32, device=self.device)
        self.q_dtype = torch.float16 if self.store.data.dtype == torch.float16 else torch.bfloat16
        self.kv_b_weight = torch.randn(self.heads * (shape.qk_nope_head_dim + shape.v_head_dim), self.rank,
                                       device=self.device, dtype=self.q_dtype)
        self.nope_dim = shape.qk_nope_head_dim
        self.page_size_hint = decode_page_size_hint(self.store.data, self.store.scale, self.rank)

    def write(self) -> None:
        slots = torch.arange(self.store.data.shape[0] * self.store.data.shape[1], device=self.device)
        self.store.write_slots(slots, torch.randn(slots.shape[0], self.dim, device=self.device), check_values=False)

    def decode(self, batch: int, q_len: int, kv_tokens_hint: int | None = None) -> None:
        """A decode of `batch` sequences, through step metadata built with `kv_tokens_hint` where one is given."""
        rows = torch.arange(batch, device=self.device) % 2
        q = torch.randn(batch, q_len, self.heads, self.dim, device=self.device, dtype=self.q_dtype)
        metadata = None
        if kv_tokens_hint is not None:
            metadata = mla_decode_metadata(self.lengths[rows], q_len=q_len, heads=self.heads,
                                           backend=self.plan.decode_backend, kv_cache_dtype=self.plan.kv_cache_dtype,
                                           kv_tokens_hint=kv_tokens_hint, page_size=self.page_size_hint)
        mla_decode(q, self.store.data, self.table[rows], self.lengths[rows], softmax_scale=self.scale,
                   backend=self.plan.decode_backend, kv_scale=self.store.scale, kv_lora_rank=self.rank,
                   metadata=metadata, return_lse=False, check_inputs=False)

    def extend(self, new_tokens: int, sequences: int = 1) -> None:
        """`new_tokens` new tokens at the end of each of `sequences` copies of the long sequence."""
        q = torch.randn(sequences * new_tokens, self.heads, self.dim, device=self.device, dtype=self.q_dtype)
        offsets = torch.arange(0, (sequences + 1) * new_tokens, new_tokens, dtype=torch.int32, device=self.device)
        long = torch.zeros(sequences, dtype=torch.long, device=self.device)
        mla_extend(q, self.store.data, self.table[long], self.lengths[long], offsets, max_q_len=new_tokens,
                   softmax_scale=self.scale, backend=self.plan.decode_backend, kv_scale=self.store.scale,
                   kv_lora_rank=self.rank, check_inputs=False)

    def prefill(self, chunk: int | None) -> None:
        new = 32
        kwargs = {} if chunk is None else {"prefix_chunk_tokens": chunk}
        meta = plan_prefill([new], [LONG_SEQUENCE], self.table[:1], self.plan.page_size, heads=self.heads, **kwargs)
        q = torch.randn(new, self.heads, self.nope_dim + self.dim - self.rank, device=self.device, dtype=self.q_dtype)
        mla_prefill(q, self.store.data, self.kv_b_weight, meta, softmax_scale=self.scale, backend=self.plan.prefill_backend,
                    kv_scale=self.store.scale, check_inputs=False)
