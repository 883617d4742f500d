"""attention/checks.py called directly, one case per refusal: the whole message (argument, what was
expected, what came) and the inputs right at each value check's boundary. Added for the gaps that
mutmut found (TESTING.md, "Mutation check"): the calls through mla_decode / mla_extend / mla_prefill
in test_checks.py match only the start of each message, and some checks there are caught earlier."""

import re

import pytest
import torch

from mlakit import plan_prefill
from mlakit.attention.checks import (
    check_decode_inputs,
    check_extend_inputs,
    check_output,
    check_prefill_inputs,
    checked_softmax_scale,
)
from mlakit.cache.kv_quant import FP8_DTYPE
from mlakit.errors import MLAInputError


def _refused(message):
    return pytest.raises(MLAInputError, match="^" + re.escape(message) + "$")


# --- mla_decode: q [2, 1, 2, 80], 6 pages of 4 tokens, 3 pages per sequence (12 tokens at most) ---


def _decode(**overrides):
    args = dict(
        q=torch.randn(2, 1, 2, 80).bfloat16(),
        kv_cache=torch.randn(6, 4, 80).bfloat16(),
        block_table=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32),
        cache_seqlens=torch.tensor([9, 4], dtype=torch.int32),
        kv_scale=None,
        kv_lora_rank=64,
    )
    return args | overrides


@pytest.mark.parametrize(
    "override, message",
    [
        ({"q": [[1.0]]}, "q: expected a torch.Tensor, got list"),
        ({"q": torch.randn(1, 2, 80).bfloat16()}, "q: expected 4 dimensions, got shape (1, 2, 80)"),
        ({"kv_cache": [[1.0]]}, "kv_cache: expected a torch.Tensor, got list"),
        ({"kv_cache": torch.randn(6, 4, 2, 80).bfloat16()},
         "kv_cache: expected [num_pages, page_size, dim] or [num_pages, page_size, 1, dim], got shape (6, 4, 2, 80)"),
        ({"kv_cache": torch.randn(6, 4, 72).bfloat16()}, "kv_cache: expected last dim 80 (the last dim of q), got shape (6, 4, 72)"),
        ({"block_table": [[0, 1]]}, "block_table: expected a torch.Tensor, got list"),
        ({"block_table": torch.tensor([0, 1, 2], dtype=torch.int32)}, "block_table: expected 2 dimensions, got shape (3,)"),
        ({"block_table": torch.tensor([[0, 1, 2]], dtype=torch.int32)},
         "block_table: expected shape [2, max_pages] (batch of q), got shape (1, 3)"),
        ({"cache_seqlens": torch.tensor([9], dtype=torch.int32)}, "cache_seqlens: expected shape [2] (batch of q), got shape (1,)"),
        ({"kv_scale": torch.ones(1)},
         "kv_scale: expected None for a torch.bfloat16 cache (scales apply to fp8 caches only), got a tensor"),
        ({"kv_cache": torch.randn(6, 4, 80).to(FP8_DTYPE), "kv_scale": torch.ones(3)},
         "kv_scale: expected one element or shape [6, 4, 1], got shape (3,)"),
        # the value checks
        ({"cache_seqlens": torch.tensor([0, -1], dtype=torch.int32)}, "cache_seqlens: expected lengths >= 0, got cache_seqlens[1] = -1"),
        ({"cache_seqlens": torch.tensor([12, 13], dtype=torch.int32)},
         "cache_seqlens: expected lengths <= max_pages * page_size = 3 * 4 = 12 (a sequence longer than its pages), "
         "got cache_seqlens[1] = 13"),
        ({"block_table": torch.tensor([[0, 1, 2], [3, 6, 5]], dtype=torch.int32), "cache_seqlens": torch.tensor([9, 5], dtype=torch.int32)},
         "block_table: expected page indices in [0, 6) for the 2 pages sequence 1 uses, got block_table[1, 1] = 6"),
        ({"block_table": torch.tensor([[0, 1, -1], [3, 4, 5]], dtype=torch.int32)},
         "block_table: expected page indices in [0, 6) for the 3 pages sequence 0 uses, got block_table[0, 2] = -1"),
    ],
)
def test_decode_refusal_names_argument_expected_and_got(override, message):
    check_decode_inputs(**_decode())
    with _refused(message):
        check_decode_inputs(**_decode(**override))


@pytest.mark.parametrize(
    "override",
    [
        {"kv_lora_rank": 1},  # the smallest latent width, with a 79-channel rope part
        {"kv_lora_rank": 79},
        {"cache_seqlens": torch.tensor([12, 12], dtype=torch.int32)},  # every page of the row full
        {"cache_seqlens": torch.tensor([0, 0], dtype=torch.int32), "block_table": torch.full((2, 3), -7, dtype=torch.int32)},
        {"block_table": torch.tensor([[0, 1, 2], [3, -7, 99]], dtype=torch.int32)},  # past sequence 1's one page
        {"kv_cache": torch.randn(6, 4, 1, 80).bfloat16()},
    ],
)
def test_decode_accepts_inputs_at_the_boundaries(override):
    check_decode_inputs(**_decode(**override))


def test_decode_checks_values_by_default():
    bad = _decode(cache_seqlens=torch.tensor([9, -1], dtype=torch.int32))
    check_decode_inputs(**bad, check_values=False)
    with _refused("cache_seqlens: expected lengths >= 0, got cache_seqlens[1] = -1"):
        check_decode_inputs(**bad)


# --- mla_extend: q [3 tokens, 2 heads, 80], segments of 2 and 1 new tokens ---


def _extend(**overrides):
    args = _decode(q=torch.randn(3, 2, 80).bfloat16()) | dict(cu_seqlens_q=torch.tensor([0, 2, 3], dtype=torch.int32), max_q_len=2)
    return args | overrides


@pytest.mark.parametrize(
    "override, message",
    [
        ({"q": [[1.0]]}, "q: expected a torch.Tensor, got list"),
        ({"q": torch.randn(3, 1, 2, 80).bfloat16()}, "q: expected 3 dimensions, got shape (3, 1, 2, 80)"),
        ({"q": torch.randn(3, 0, 80).bfloat16()}, "q: expected [tokens, heads, dim] with heads >= 1, got shape (3, 0, 80)"),
        ({"cu_seqlens_q": torch.tensor([0], dtype=torch.int32)}, "cu_seqlens_q: expected [batch + 1] offsets with batch >= 1, got shape (1,)"),
        ({"max_q_len": 0}, "max_q_len: expected an integer >= 1 (the most new tokens of any sequence), got 0"),
        ({"cu_seqlens_q": torch.tensor([0, 1, 2, 3], dtype=torch.int32)},
         "cu_seqlens_q: expected 3 offsets (batch + 1, block_table has 2 rows), got shape (4,)"),
        ({"max_q_len": 1}, "max_q_len: expected >= the longest segment (2 new tokens), got 1"),
        ({"cache_seqlens": torch.tensor([1, 4], dtype=torch.int32)},
         "cache_seqlens: expected each length >= its segment's new tokens (they are already in the cache), got [1, 4]"),
    ],
)
def test_extend_refusal_names_argument_expected_and_got(override, message):
    check_extend_inputs(**_extend())
    with _refused(message):
        check_extend_inputs(**_extend(**override))


def test_extend_accepts_segments_right_at_their_limits():
    # the longest segment = max_q_len, each segment = its cache length
    check_extend_inputs(**_extend(cache_seqlens=torch.tensor([2, 1], dtype=torch.int32)))


# --- mla_prefill: 3 new tokens of one sequence reading 6 cached tokens on pages 0 and 1 of 4 ---


def _prefill(**overrides):
    """q [3, 2 heads, 48 = d_nope 32 + d_rope 16], a [4, 4, 80] cache (rank 64 + rope 16), d_v 32."""
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    args = dict(
        q=torch.randn(3, 2, 48).bfloat16(),
        kv_cache=torch.randn(4, 4, 80).bfloat16(),
        kv_b_weight=torch.randn(2 * (32 + 32), 64).bfloat16(),
        meta=plan_prefill([3], [6], table, 4),
        kv_scale=None,
    )
    return args | overrides


_ROW_WIDTHS = ("kv_b_weight: expected [heads * (d_nope + d_v), kv_lora_rank] with kv_lora_rank < the cache's row width 80 - d_rope "
               "and q's last dim {} = d_nope + d_rope, got shape {}")


@pytest.mark.parametrize(
    "override, message",
    [
        ({"meta": {}}, "meta: expected a PrefillMetadata (from plan_prefill), got dict"),
        ({"kv_cache": [[1.0]]}, "kv_cache: expected a torch.Tensor, got list"),
        ({"q": torch.randn(2, 2, 48).bfloat16()}, "q: expected 3 tokens (the prefill metadata's new tokens), got shape (2, 2, 48)"),
        ({"q": torch.randn(3, 0, 48).bfloat16()}, "q: expected [tokens, heads, d_nope + d_rope] with heads >= 1, got shape (3, 0, 48)"),
        ({"kv_cache": torch.randn(4, 4, 2, 80).bfloat16()},
         "kv_cache: expected [num_pages, page_size, dim] or [num_pages, page_size, 1, dim], got shape (4, 4, 2, 80)"),
        ({"kv_cache": torch.randn(2, 8, 80).bfloat16()},
         "kv_cache: expected pages of 4 tokens (the page size the metadata was planned for), got shape (2, 8, 80)"),
        ({"kv_b_weight": torch.randn(128, 80).bfloat16()}, _ROW_WIDTHS.format(48, (128, 80))),  # d_rope 0
        ({"q": torch.randn(3, 2, 16).bfloat16()}, _ROW_WIDTHS.format(16, (128, 64))),  # d_nope 0
        ({"kv_b_weight": torch.randn(129, 64).bfloat16()}, "kv_b_weight: expected 2 heads x (d_nope 32 + d_v) rows, got shape (129, 64)"),
        ({"kv_b_weight": torch.randn(64, 64).bfloat16()}, "kv_b_weight: expected 2 heads x (d_nope 32 + d_v) rows, got shape (64, 64)"),
        # reads token 0 of page 4 only: slot 16 = num_pages * page_size, one past the cache
        ({"meta": plan_prefill([3], [5], torch.tensor([[0, 4]], dtype=torch.int32), 4)},
         "block_table: expected page indices in [0, 4) for every page the prefill reads (as planned by plan_prefill), "
         "got an index out of range"),
    ],
)
def test_prefill_refusal_names_argument_expected_and_got(override, message):
    check_prefill_inputs(**_prefill())
    with _refused(message):
        check_prefill_inputs(**_prefill(**override))  # values are checked by default


@pytest.mark.parametrize(
    "override",
    [
        {"q": torch.randn(3, 1, 48).bfloat16(), "kv_b_weight": torch.randn(64, 64).bfloat16()},  # one head
        {"kv_b_weight": torch.randn(2 * (47 + 1), 79).bfloat16()},  # d_rope 1, d_nope 47, d_v 1
        {"q": torch.randn(3, 2, 17).bfloat16(), "kv_b_weight": torch.randn(2 * (1 + 8), 64).bfloat16()},  # d_nope 1
        {"kv_b_weight": torch.randn(2 * (32 + 1), 64).bfloat16()},  # d_v 1
        {"kv_cache": torch.randn(4, 4, 1, 80).bfloat16()},
        {"meta": plan_prefill([3], [4], torch.tensor([[3, 4]], dtype=torch.int32), 4)},  # page 4 listed but not read
    ],
)
def test_prefill_accepts_inputs_at_the_boundaries(override):
    check_prefill_inputs(**_prefill(**override))


def test_prefill_metadata_must_be_planned_on_the_device_of_q():
    on_meta = _prefill(q=torch.empty(3, 2, 48, dtype=torch.bfloat16, device="meta"),
                       kv_cache=torch.empty(4, 4, 80, dtype=torch.bfloat16, device="meta"),
                       kv_b_weight=torch.empty(128, 64, dtype=torch.bfloat16, device="meta"))
    with _refused("meta: expected prefill metadata planned on meta (the device of q), got cpu"):
        check_prefill_inputs(**on_meta, check_values=False)


# --- outputs the caller passes in ---


@pytest.mark.parametrize(
    "tensor, shape, mergeable, message",
    [
        (torch.empty(2, 3, 5), (2, 3, 4), 1, "out: expected shape [2, 3, 4], got shape (2, 3, 5)"),
        (torch.empty(2, 4, 3).transpose(1, 2), (2, 3, 4), 1, "out: expected a [2, 3, 4] tensor with a contiguous last dim, got strides (12, 1, 3)"),
        (torch.empty(2, 3, 3, 8)[:, :2], (2, 2, 3, 8), 2,
         "out: expected a [2, 2, 3, 8] tensor with a contiguous last dim and its first two dims viewable as one, got strides (72, 24, 8, 1)"),
    ],
)
def test_output_refusal_names_argument_expected_and_got(tensor, shape, mergeable, message):
    with _refused(message):
        check_output("out", tensor, shape, torch.float32, torch.device("cpu"), mergeable=mergeable)


def test_output_of_one_sequence_needs_no_mergeable_strides():
    """Batch 1: [1, q_len] always views as [q_len], whatever the first stride."""
    check_output("out", torch.empty(1, 3, 3, 8)[:, :2], (1, 2, 3, 8), torch.float32, torch.device("cpu"), mergeable=2)


# --- softmax_scale ---


@pytest.mark.parametrize(
    "scale, message",
    [
        ("0.1", "softmax_scale: expected a finite number > 0 (a Python or NumPy float), got '0.1'"),
        (True, "softmax_scale: expected a finite number > 0 (a Python or NumPy float), got True"),
        (-0.125, "softmax_scale: expected a finite number > 0, got -0.125"),
        (0, "softmax_scale: expected a finite number > 0, got 0.0"),
    ],
)
def test_softmax_scale_refusal_names_what_came(scale, message):
    with _refused(message):
        checked_softmax_scale(scale)
