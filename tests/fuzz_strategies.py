"""Hypothesis strategies shared by the fuzz tests: valid inputs of each entry point, and the
malformed values a mutation swaps in (non-integers, bad tensors, broken offsets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from hypothesis import strategies as st

from paged_inputs import PagedBatch, make_paged_batch

Expect = Literal["error", "same", "oracle"]
"""What a mutated call must give: an error naming the argument, the unmutated call's result, or the oracle's."""

NOT_AN_INT = st.sampled_from([2.5, float("nan"), float("inf"), "3", None, True, [1]])
NOT_A_POSITIVE_NUMBER = st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -1.0, "0.1", True, [0.1]])
NOT_A_BACKEND = st.sampled_from(["no-such-backend", "", 5, None, ["reference"]])
NOT_A_TENSOR_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8)


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One way to break (or legitimately vary) a call: `apply(draw, kwargs)` edits the call's keyword
    arguments in place and says what the call must then give; an error must name one of `blamed`."""

    label: str
    blamed: tuple[str, ...]
    apply: Callable[[st.DrawFn, dict[str, Any]], Expect]


def tensor_mutations(argument: str, good_dtypes: tuple[torch.dtype, ...], blamed: tuple[str, ...] = ()) -> list[Mutation]:
    """Type, rank, dtype and emptiness breakages every tensor argument must refuse naming itself."""
    names = (argument, *blamed)

    def not_a_tensor(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        kwargs[argument] = draw(st.sampled_from([kwargs[argument].cpu().float().tolist(), None, 3, "tensor"]))
        return "error"

    def extra_dim(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        kwargs[argument] = kwargs[argument].unsqueeze(-1).expand(*kwargs[argument].shape, 2)
        return "error"

    def missing_dim(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        kwargs[argument] = kwargs[argument][..., 0]
        return "error"

    def wrong_dtype(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        dtype = draw(st.sampled_from([d for d in NOT_A_TENSOR_DTYPES + (torch.bfloat16, torch.float16) if d not in good_dtypes]))
        kwargs[argument] = kwargs[argument].to(dtype)
        return "error"

    return [
        Mutation(f"{argument} not a tensor", names, not_a_tensor),
        Mutation(f"{argument} extra dim", names, extra_dim),
        Mutation(f"{argument} missing dim", names, missing_dim),
        Mutation(f"{argument} wrong dtype", names, wrong_dtype),
    ]


def value_mutation(argument: str, values: st.SearchStrategy[Any], blamed: tuple[str, ...] = ()) -> Mutation:
    """Replaces a scalar argument by a drawn bad value."""

    def apply(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        kwargs[argument] = draw(values)
        return "error"

    return Mutation(f"bad {argument}", (argument, *blamed), apply)


def valid_value_mutation(argument: str, values: st.SearchStrategy[Any]) -> Mutation:
    """Replaces an argument by a drawn valid value that must not change the result (a policy knob)."""

    def apply(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        kwargs[argument] = draw(values)
        return "same"

    return Mutation(f"valid {argument}", (), apply)


def count_entry_mutation(argument: str, values: st.SearchStrategy[Any]) -> Mutation:
    """Replaces one entry of a per-sequence count list or tuple by a drawn bad value."""

    def apply(draw: st.DrawFn, kwargs: dict[str, Any]) -> Expect:
        counts = list(kwargs[argument])
        counts[draw(st.integers(0, len(counts) - 1))] = draw(values)
        kwargs[argument] = type(kwargs[argument])(counts)
        return "error"

    return Mutation(f"{argument} entry", (argument, "sequence"), apply)


@st.composite
def paged_batches(draw: st.DrawFn, q_len: int | None = None) -> PagedBatch:
    """A small valid paged batch (bf16, fp16 or fp8 cache; garbage past each sequence's pages)."""
    batch = draw(st.integers(1, 3))
    kv_dtype = draw(st.sampled_from(["bf16", "fp16", "fp8_e4m3"]))
    return make_paged_batch(
        draw(st.lists(st.integers(0, 40), min_size=batch, max_size=batch)),
        heads=draw(st.integers(1, 3)),
        q_len=q_len or draw(st.integers(1, 3)),
        page_size=draw(st.sampled_from([1, 4, 16])),
        kv_lora_rank=32,
        rope_dim=16,
        kv_dtype=kv_dtype,
        scale_layout=draw(st.sampled_from(["tensor", "group"])) if kv_dtype == "fp8_e4m3" else "tensor",
        q_dtype=torch.float16 if kv_dtype == "fp16" else torch.bfloat16,
        seed=draw(st.integers(0, 2**16)),
    )


TINY_DEEPSEEK = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
    v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
    first_k_dense_replace=1, max_position_embeddings=128, q_lora_rank=16, num_mtp_layers=0,
)


def save_tiny_deepseek(directory: Path) -> Path:
    """A random two-layer DeepSeek-V3 checkpoint (one dense layer, one MoE layer) in `directory`."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(**TINY_DEEPSEEK, dtype=torch.float32)).save_pretrained(directory)
    return directory
