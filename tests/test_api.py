"""mla_decode: one entry point for every backend; auto selection and explicit choices."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mlakit
from mlakit import ConfigError, MLAInputError
from mlakit.attention.functional import mla_extend_metadata
from paged_inputs import assert_lse_close, make_paged_batch, naive_decode, relative_error


@pytest.mark.parametrize(
    "seq_lens, heads, q_len, page_size, kv_dtype, layout",
    [
        ([7, 0, 40], 5, 1, 16, "bf16", "tensor"),
        ([33, 2], 16, 3, 1, "fp16", "tensor"),
        ([64, 65, 1], 3, 2, 64, "fp8_e4m3", "tensor"),
        ([20, 9], 1, 4, 8, "fp8_e4m3", "group"),
    ],
)
def test_mla_decode_matches_oracle(seq_lens, heads, q_len, page_size, kv_dtype, layout):
    batch = make_paged_batch(
        seq_lens, heads=heads, q_len=q_len, page_size=page_size, kv_dtype=kv_dtype, scale_layout=layout,
        kv_lora_rank=512, rope_dim=64, q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
    )
    out, lse = mlakit.mla_decode(
        batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens,
        softmax_scale=batch.softmax_scale, kv_scale=batch.kv_scale,
    )
    expected_out, expected_lse = naive_decode(batch)
    assert out.dtype == batch.q.dtype and lse.dtype == torch.float32
    assert out.shape == (len(seq_lens), q_len, heads, 512) and lse.shape == (len(seq_lens), heads, q_len)
    assert relative_error(out, expected_out) < 1e-2
    assert_lse_close(lse, expected_lse, atol=1e-3)


def test_latent_256_needs_no_hint_and_other_widths_need_kv_lora_rank():
    batch = make_paged_batch([10, 3], heads=4, kv_lora_rank=256, rope_dim=32)
    out, _ = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    assert out.shape[-1] == 256
    odd = make_paged_batch([10, 3], heads=4, kv_lora_rank=64, rope_dim=16)
    with pytest.raises(mlakit.MLAInputError, match="kv_lora_rank: cannot infer"):
        mlakit.mla_decode(odd.q, odd.kv_cache, odd.block_table, odd.cache_seqlens)
    out, lse = mlakit.mla_decode(odd.q, odd.kv_cache, odd.block_table, odd.cache_seqlens, kv_lora_rank=64, softmax_scale=odd.softmax_scale)
    assert relative_error(out, naive_decode(odd)[0]) < 1e-2


def test_default_softmax_scale_is_one_over_sqrt_of_the_row_width():
    batch = make_paged_batch([12], heads=2, kv_lora_rank=512, rope_dim=64)
    default, _ = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    explicit, _ = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, softmax_scale=576**-0.5)
    assert torch.equal(default, explicit)


def test_explicit_backend_that_cannot_run_here_is_refused_with_reasons():
    batch = make_paged_batch([12], heads=2, page_size=64, kv_lora_rank=512, rope_dim=64)
    with pytest.raises(ConfigError, match=r"backend 'flashmla' cannot run this decode call: runs on cuda, not on cpu"):
        mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, backend="flashmla")
    with pytest.raises(ConfigError, match=r"unknown backend 'fastest'"):
        mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, backend="fastest")


def test_return_lse_false_gives_none():
    batch = make_paged_batch([5, 6], heads=3, kv_lora_rank=512, rope_dim=64)
    out, lse = mlakit.mla_decode(batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, backend="reference", return_lse=False)
    assert lse is None and out.shape == (2, 1, 3, 512)


def test_reference_path_works_without_triton_installed():
    """The reference path, the page-size hint, both drop-ins and warm-up on the CPU, with triton unimportable."""
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, mlakit\n"
        "from mlakit.compat.flash_mla import flash_mla_with_kvcache, get_mla_metadata\n"
        "from mlakit.compat.flashinfer import BatchMLAPagedAttentionWrapper\n"
        "from mlakit.serving.warmup import warm_up\n"
        "q = torch.randn(1, 1, 2, 576).bfloat16(); kv = torch.randn(2, 64, 576).bfloat16()\n"
        "table, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([5], dtype=torch.int32)\n"
        "out, lse = mlakit.mla_decode(q, kv, table, lengths)\n"
        "drop_in, _ = flash_mla_with_kvcache(q, kv.unsqueeze(2), table, lengths, 512, *get_mla_metadata())\n"
        "wrapper = BatchMLAPagedAttentionWrapper(torch.empty(8, dtype=torch.uint8))\n"
        "offsets = torch.tensor([0, 1], dtype=torch.int32)\n"
        "wrapper.plan(offsets, offsets, table[0], lengths, 2, 512, 64, 64, True, 0.07, torch.bfloat16, torch.bfloat16)\n"
        "planned = wrapper.run(query=q[0], kv_cache=kv)\n"
        "plan = mlakit.resolve(mlakit.ServingConfig(max_batch_size=2), mlakit.MLAShape.preset('deepseek-v2-lite'),\n"
        "                      mlakit.DeviceInfo.from_arch('cpu'))\n"
        "warm_up(plan, max_latent_extend_tokens=0)\n"
        "record = mlakit.registry.get_backend('triton').record\n"
        "hint = mlakit.decode_page_size_hint(kv, None, 512)\n"
        "print(tuple(out.shape), tuple(drop_in.shape), tuple(planned.shape), hint, record.missing_packages())\n"
    )
    source = Path(mlakit.__file__).resolve().parents[1]
    checkout_src = [str(source)] if source.name == "src" else []  # a checkout where mlakit may not be installed
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = os.environ | {"PYTHONPATH": os.pathsep.join(checkout_src + inherited)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "(1, 1, 2, 512) (1, 1, 2, 512) (1, 2, 512) 64 ['triton']"


def test_mla_extend_matches_the_reference_and_checks_its_offsets():
    batch = make_paged_batch([12, 5, 30], heads=3, page_size=8, kv_lora_rank=512, rope_dim=64, seed=4)
    q = torch.randn(9, 3, 576).bfloat16()
    cu = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    out, lse = mlakit.mla_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu, max_q_len=5,
                                 softmax_scale=batch.softmax_scale)
    ref_out, ref_lse = mlakit.reference_extend(q, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu,
                                               kv_lora_rank=512, softmax_scale=batch.softmax_scale, compute_dtype=torch.float64)
    assert out.dtype == torch.bfloat16 and relative_error(out, ref_out) < 1e-2
    assert_lse_close(lse, ref_lse, atol=1e-3)
    call = lambda **kw: mlakit.mla_extend(**({"q": q, "kv_cache": batch.kv_cache, "block_table": batch.block_table,  # noqa: E731
                                              "cache_seqlens": batch.cache_seqlens, "cu_seqlens_q": cu, "max_q_len": 5} | kw))
    with pytest.raises(mlakit.MLAInputError, match="cu_seqlens_q: expected the last offset to equal q's 9 tokens, got 8"):
        call(cu_seqlens_q=torch.tensor([0, 3, 8, 8], dtype=torch.int32))
    with pytest.raises(mlakit.MLAInputError, match=r"max_q_len: expected >= the longest segment \(5 new tokens\)"):
        call(max_q_len=4)
    with pytest.raises(mlakit.MLAInputError, match="cache_seqlens: expected each length >= its segment's new tokens"):
        call(cache_seqlens=torch.tensor([2, 5, 30], dtype=torch.int32))
    with pytest.raises(mlakit.MLAInputError, match=r"cu_seqlens_q: expected dtype in \['torch.int32'\]"):
        call(cu_seqlens_q=cu.long())


def test_extend_capability_is_in_the_records():
    records = {r.name: r for r in mlakit.registry.all_records()}
    assert records["reference"].latent_extend and records["triton"].latent_extend
    assert not records["flashmla"].latent_extend
    assert mlakit.registry.get_backend("triton").extend is not None


def test_decode_metadata_built_once_serves_every_layer_and_must_match_the_call(kernel_device):
    backend = "triton" if kernel_device == "cuda" else "reference"
    batch = make_paged_batch([300, 0, 41], heads=5, q_len=2, page_size=16, kv_lora_rank=512, rope_dim=64, device=kernel_device)
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend=backend)
    assert (metadata.data is not None) == (backend == "triton")
    args = (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    kwargs = dict(softmax_scale=batch.softmax_scale, backend=backend, kv_lora_rank=512)
    plain, plain_lse = mlakit.mla_decode(*args, **kwargs)
    for _ in range(2):  # two "layers" sharing the step's metadata
        out, lse = mlakit.mla_decode(*args, metadata=metadata, **kwargs)
        assert torch.equal(out, plain) and torch.equal(lse, plain_lse)
    with pytest.raises(mlakit.MLAInputError, match="metadata: built for backend .* batch 3, q_len 2, 5 heads, a bf16 cache; "
                                                   "this call runs on .* batch 3, q_len 1"):
        mlakit.mla_decode(batch.q[:, :1].contiguous(), *args[1:], metadata=metadata, **kwargs)
    fp16_cache = batch.kv_cache.to(torch.float16)
    with pytest.raises(mlakit.MLAInputError, match="metadata: built for .* a bf16 cache; this call runs on .* a fp16 cache"):
        mlakit.mla_decode(batch.q, fp16_cache, *args[2:], metadata=metadata, **kwargs)
    fp16_metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend=backend, kv_cache_dtype="fp16")
    out, _ = mlakit.mla_decode(batch.q, fp16_cache, *args[2:], metadata=fp16_metadata, **kwargs)
    assert relative_error(out, plain) < 1e-2
    with pytest.raises(mlakit.MLAInputError, match=r"kv_cache_dtype: expected one of \['bf16', .*\], got 'int8'"):
        mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend=backend, kv_cache_dtype="int8")


def test_backend_for_names_the_backend_whose_metadata_an_auto_call_takes(kernel_device):
    """`backend_for` gives "auto" decode and extend calls the backend to build metadata for (the registry's pick:
    triton on CUDA, the reference on the CPU), passes a named backend through, and names bad arguments."""
    batch = make_paged_batch([300, 0, 41], heads=5, q_len=2, page_size=16, kv_lora_rank=512, rope_dim=64,
                             device=kernel_device)
    picked = mlakit.backend_for("decode", batch.q, batch.kv_cache)
    assert picked == ("triton" if kernel_device == "cuda" else "reference")
    assert mlakit.backend_for("decode", batch.q, batch.kv_cache, backend="reference") == "reference"
    metadata = mlakit.mla_decode_metadata(batch.cache_seqlens, q_len=2, heads=5, backend=picked, kv_tokens_hint=341)
    args = (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)
    out, _ = mlakit.mla_decode(*args, softmax_scale=batch.softmax_scale, kv_lora_rank=512, metadata=metadata)
    plain, _ = mlakit.mla_decode(*args, softmax_scale=batch.softmax_scale, kv_lora_rank=512)
    assert torch.equal(out, plain)
    packed = batch.q[[0, 2]].flatten(0, 1)  # the empty sequence takes no new tokens
    cu_seqlens_q = torch.tensor([0, 2, 2, 4], dtype=torch.int32, device=kernel_device)
    assert mlakit.backend_for("extend", packed, batch.kv_cache) == picked
    extend_metadata = mla_extend_metadata(batch.cache_seqlens, cu_seqlens_q, max_q_len=2, heads=5, backend=picked)
    extend_args = (packed, batch.kv_cache, batch.block_table, batch.cache_seqlens, cu_seqlens_q)
    out, _ = mlakit.mla_extend(*extend_args, max_q_len=2, softmax_scale=batch.softmax_scale, kv_lora_rank=512,
                               metadata=extend_metadata)
    plain, _ = mlakit.mla_extend(*extend_args, max_q_len=2, softmax_scale=batch.softmax_scale, kv_lora_rank=512)
    assert torch.equal(out, plain)
    with pytest.raises(MLAInputError, match=r"^q: expected a 4-dimensional tensor \[batch, q_len, heads, dim\]"):
        mlakit.backend_for("decode", packed, batch.kv_cache)
    with pytest.raises(MLAInputError, match=r"^q: expected a 3-dimensional tensor \[tokens, heads, dim\]"):
        mlakit.backend_for("extend", batch.q, batch.kv_cache)
    bad_caches = [(torch.zeros(5), r"3 dimensions, got shape \(5,\)"),
                  (batch.kv_cache.to(torch.float64), r"dtype in \[.*\], got torch.float64"),
                  (batch.kv_cache.unsqueeze(2).expand(-1, -1, 2, -1), r"\[num_pages, page_size, dim\] or .*, got shape"),
                  (batch.kv_cache[..., :100], r"last dim 576 \(the last dim of q\)")]
    for cache, expected in bad_caches:
        with pytest.raises(MLAInputError, match=rf"^kv_cache: expected {expected}"):
            mlakit.backend_for("decode", batch.q, cache)
    with pytest.raises(MLAInputError, match=r"^kv_lora_rank: cannot infer it from q's last dim 100"):
        mlakit.backend_for("decode", batch.q[..., :100], batch.kv_cache)
    with pytest.raises(MLAInputError, match=r"^kv_lora_rank: expected an integer in 1..575 .*, got 600"):
        mlakit.backend_for("extend", packed, batch.kv_cache, kv_lora_rank=600)
    with pytest.raises(MLAInputError, match=r"^call: expected 'decode' or 'extend', got 'prefill'"):
        mlakit.backend_for("prefill", packed, batch.kv_cache)


@pytest.mark.parametrize("name, hint, expected", [
    *[("kv_tokens_hint", hint, "a non-negative int") for hint in (-1, 1.5, "4096", True)],
    *[("page_size", hint, "a positive int") for hint in (0, -64, 64.0, "64", False)],
])
def test_decode_metadata_refuses_a_hint_that_is_not_a_count(name, hint, expected):
    lengths = torch.tensor([20, 3], dtype=torch.int32)
    for build in (lambda: mlakit.mla_decode_metadata(lengths, q_len=1, heads=4, backend="reference", **{name: hint}),
                  lambda: mla_extend_metadata(lengths, torch.tensor([0, 1, 2], dtype=torch.int32), max_q_len=1,
                                              heads=4, backend="reference", **{name: hint})):
        with pytest.raises(mlakit.MLAInputError, match=rf"{name}: expected None or {expected} .*, got "):
            build()


def test_decode_metadata_hands_the_hint_to_the_split_plan(monkeypatch):
    """The triton backends' builders pass `kv_tokens_hint` and `page_size` on to the plan (which picks tiles by the
    first, `wide_narrow_tile`, and ragged equal shares by the second)."""
    from mlakit.kernels import triton_decode

    seen = []
    for name in ("plan_decode", "plan_extend"):
        original = getattr(triton_decode, name)
        monkeypatch.setattr(triton_decode, name, lambda *args, _original=original, **kwargs:
                            seen.append((kwargs["kv_tokens_hint"], kwargs["page_size"])) or _original(*args, **kwargs))
    lengths = torch.tensor([20, 3], dtype=torch.int32)
    mlakit.mla_decode_metadata(lengths, q_len=1, heads=4, backend="triton", kv_tokens_hint=23, page_size=64)
    mla_extend_metadata(lengths, torch.tensor([0, 1, 2], dtype=torch.int32), max_q_len=1, heads=4,
                        backend="triton", kv_tokens_hint=23, page_size=16)
    mlakit.mla_decode_metadata(lengths, q_len=1, heads=4, backend="triton")
    assert seen == [(23, 64), (23, 16), (None, None)]


@pytest.mark.parametrize("pages, scale, rank, hint", [
    ((3, 64, 576), None, 512, 64),                                # bf16 on whole 64-token tiles
    ((3, 128, 1, 576), None, 512, 128),                           # FlashMLA's head axis
    ((3, 64, 288), None, 256, 64),                                # the smaller latent
    ((3, 16, 576), None, 512, None),                              # pages that are not whole tiles
    ((3, 64, 48), None, 32, None),                                # a latent too narrow for the persistent kernel
    ((3, 64, 576), torch.ones(1), 512, 64),                       # fp8 with one scale
    ((3, 64, 576), torch.ones(3, 64, 5), 512, None),              # fp8 with per-group scales
    ((3, 64, 288), torch.ones(1), 256, None),                     # fp8 at widths other than 512 + 64
    ((576,), None, 512, None),                                    # not a cache: the call refuses it, not the hint
])
def test_decode_page_size_hint_names_the_page_size_where_the_persistent_kernel_reads_the_cache(pages, scale, rank,
                                                                                               hint):
    dtype = torch.bfloat16 if scale is None else torch.float8_e4m3fn
    assert mlakit.decode_page_size_hint(torch.zeros(pages, dtype=dtype), scale, rank) == hint


@pytest.mark.parametrize("arguments, pattern", [
    (("pages", None, 512), r"kv_cache: expected a torch.Tensor, got str"),
    ((torch.zeros(3, 64, 576, dtype=torch.bfloat16), None, None), r"kv_lora_rank: expected an integer >= 1 .*got None"),
    ((torch.zeros(3, 64, 576, dtype=torch.bfloat16), None, 0), r"kv_lora_rank: expected an integer >= 1 .*got 0"),
])
def test_decode_page_size_hint_names_a_bad_argument(arguments, pattern):
    with pytest.raises(MLAInputError, match=pattern):
        mlakit.decode_page_size_hint(*arguments)
