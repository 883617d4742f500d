"""Warm start: after `warm_up(plan)`, serving steps of any batch size and mix compile nothing new."""

from unittest import mock

import pytest
import torch

from mlakit import ConfigError, DeviceInfo, MLAShape, ServingConfig, resolve
from mlakit.attention.functional import mla_decode_metadata
from mlakit.serving.forward import mla_forward
from mlakit.kernels import (cache_write, decode_split_plan, gather_decompress, hopper_decode, hopper_narrow_decode,
                            triton_decode, triton_prefill)
from mlakit.serving.step import AttentionStep
from mlakit.serving.warmup import warm_up

KERNELS = (triton_decode._mla_decode_split_kernel, triton_decode._mla_decode_combine_kernel,
           decode_split_plan._split_counts_kernel, triton_prefill._mha_prefill_kernel, cache_write._write_rows_kernel,
           hopper_decode.mla_decode_hopper_seesaw_kernel, hopper_decode.mla_decode_hopper_fp8_kernel,
           hopper_decode.mla_decode_hopper_split_kernel, hopper_narrow_decode.mla_decode_hopper_narrow_fp8_kernel,
           gather_decompress._gather_decompress_kernel)


def compiled_variants() -> dict[str, set[str]]:
    """The keys of the kernel binaries Triton holds for each of our kernels (its per-device JIT caches)."""
    variants = {}
    for kernel in KERNELS:
        caches = getattr(kernel, "device_caches", None)
        if caches is None:
            pytest.skip("this Triton keeps its JIT cache elsewhere")
        variants[kernel.fn.__name__] = {str(key) for entry in caches.values() for key in entry[0]}
    return variants


def test_warm_up_reports_its_calls_in_the_plan_on_cpu():
    plan = warm_up(resolve(ServingConfig(max_batch_size=16, speculative_num_draft_tokens=2), MLAShape.preset("deepseek-v2-lite"),
                           DeviceInfo.from_arch("cpu")))
    assert plan.warmup is not None and plan.warmup.seconds > 0
    assert "decode q_len 3, batch 16" in plan.warmup.calls and "decode q_len 1, batch 16" in plan.warmup.calls
    assert "decode q_len 3, batch 1" in plan.warmup.calls, "batch 1 has a split ceiling of its own"
    extends = [call for call in plan.warmup.calls if call.startswith("latent extend") and "sequences" in call]
    assert extends == [f"latent extend of {tokens} tokens x {n} sequences"
                       for tokens in range(1, 17) for n in (2, 4, 8, 16)], "one-token prompts extend too"


def test_warm_up_runs_each_decode_again_through_metadata_hinting_a_large_and_a_small_batch(kernel_device):
    """A backend that builds step metadata gets every decode class again with a large and with a small
    `kv_tokens_hint` (steps pass their cached tokens, which may pick other tiles or kernel variants); one without (the
    reference) does not."""
    shape = MLAShape.preset("deepseek-v2-lite")
    for backend, hinted in (("triton", True), ("reference", False)):
        plan = warm_up(resolve(ServingConfig(device=kernel_device, max_batch_size=2, decode_backend=backend), shape),
                       max_latent_extend_tokens=0)
        for size in ("large", "small"):
            assert (f"decode q_len 1, batch 2, metadata hinted a {size} batch" in plan.warmup.calls) == hinted, backend


@pytest.mark.parametrize("scale_layout, hinted", [("tensor", True), ("group", False)])
def test_warm_up_hints_the_page_size_unless_the_fp8_scales_are_per_group(kernel_device, scale_layout, hinted):
    """As a step's metadata: the hinted decodes pass `decode_page_size_hint` of the warm-up cache, the page size
    here except over per-group fp8 scales, which only grid kernels read (the hint lets plans take equal shares, for
    the persistent kernel)."""
    config = ServingConfig(device=kernel_device, max_batch_size=2, decode_backend="triton", kv_cache_dtype="fp8_e4m3")
    plan = resolve(config, MLAShape.preset("deepseek-v2-lite"))
    with mock.patch("mlakit.serving.warmup.mla_decode_metadata", wraps=mla_decode_metadata) as build:
        warm_up(plan, scale_layout=scale_layout, max_latent_extend_tokens=0)
    assert build.call_count > 0
    assert {call.kwargs["page_size"] for call in build.call_args_list} == {plan.page_size if hinted else None}


def test_warm_up_without_latent_extends_runs_none():
    plan = warm_up(resolve(ServingConfig(max_batch_size=4), MLAShape.preset("deepseek-v2-lite"), DeviceInfo.from_arch("cpu")),
                   max_latent_extend_tokens=0)
    assert not any(call.startswith("latent extend") for call in plan.warmup.calls)
    assert "MHA prefill, chunked prefix with merges" in plan.warmup.calls
    assert plan.to_dict()["warmup"]["calls"] == list(plan.warmup.calls)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype, draft_tokens, tp", [("bf16", 0, 8), ("fp8_e4m3", 3, 8), ("bf16", 1, 1)])
def test_after_warm_up_no_step_compiles_a_kernel(kv_dtype, draft_tokens, tp):
    """Serving steps of changing batches, block-table widths and mixes of decodes, extends and prefills compile no
    kernel variant the warm-up did not: 16 heads a rank, and 128 at two query tokens (short steps: the seesaw's
    variant for short units, `hopper_decode.left_scores_ahead`)."""
    shape = MLAShape.preset("deepseek-v3").for_tp(tp)
    plan = resolve(ServingConfig(attention_backend="triton", max_batch_size=64, kv_cache_dtype=kv_dtype,
                                 speculative_num_draft_tokens=draft_tokens, page_size=64), shape)
    assert plan.decode_backend == "triton" and plan.prefill_backend == "triton"
    plan = warm_up(plan)
    before = compiled_variants()
    assert any(before.values())

    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, rank, rope, nope, v_dim = shape.num_heads, shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim, shape.v_head_dim
    num_pages = 400
    cache = torch.randn(num_pages, 64, rank + rope, device="cuda", generator=gen).to(torch.float8_e4m3fn if kv_dtype == "fp8_e4m3" else torch.bfloat16)
    scale = torch.ones(1, device="cuda") if kv_dtype == "fp8_e4m3" else None
    weight = torch.randn(heads * (nope + v_dim), rank, device="cuda", generator=gen).bfloat16() / rank**0.5
    q_len = plan.decode_q_len
    for step_index, batch in enumerate([1, 3, 17, 64, 40, 2, 33, 9]):
        width = 3 + step_index % 5  # block tables of changing width
        table = torch.randint(0, num_pages, (batch, width), device="cuda", generator=gen, dtype=torch.int32)
        news, lens = [], []
        for b in range(batch):
            kind = (b + step_index) % 4
            new = {0: q_len, 1: q_len, 2: 1 + b % 16, 3: 17 + 13 * b}[kind]
            total = min(width * 64, new + (0 if kind == 3 and b % 2 else 11 * b + 1))
            news.append(min(new, total))
            lens.append(total)
        tokens = sum(news)
        step = AttentionStep(tuple(news), tuple(lens), table, torch.full((tokens,), -1, device="cuda"), page_size=64,
                             decode_q_len=q_len, heads=heads, prefix_chunk_tokens=256)
        mla_forward(torch.randn(tokens, heads, nope, device="cuda", generator=gen).bfloat16(),
                    torch.randn(tokens, heads, rope, device="cuda", generator=gen).bfloat16(), cache, scale, weight, step,
                    softmax_scale=shape.softmax_scale, decode_backend="triton", prefill_backend="triton", check_inputs=False)
    torch.cuda.synchronize()
    missed = {name: keys - before[name] for name, keys in compiled_variants().items() if keys - before[name]}
    assert not missed, f"serving steps compiled kernel variants the warm-up missed: {missed}"


@pytest.mark.parametrize("call, pattern", [
    (lambda: warm_up(None), r"plan: expected a Plan \(mlakit.resolve\(...\)\), got NoneType"),
    (lambda: warm_up(_cpu_plan(), max_latent_extend_tokens=-1), r"max_latent_extend_tokens: expected an integer >= 0"),
    (lambda: warm_up(_cpu_plan(), max_latent_extend_tokens=2.5), r"max_latent_extend_tokens: expected an integer >= 0"),
])
def test_warm_up_names_a_bad_argument(call, pattern):
    with pytest.raises(ConfigError, match=pattern):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_warm_up_refuses_a_plan_for_a_device_this_machine_lacks():
    plan = resolve(ServingConfig(max_batch_size=4), MLAShape.preset("deepseek-v2-lite"), DeviceInfo.from_arch("sm90"))
    with pytest.raises(ConfigError, match=r"plan: expected one for a device this machine has, got one for "
                                          r"hypothetical sm90 \(no cuda device here\)"):
        warm_up(plan)


def _cpu_plan():
    return resolve(ServingConfig(max_batch_size=4), MLAShape.preset("deepseek-v2-lite"), DeviceInfo.from_arch("cpu"))
