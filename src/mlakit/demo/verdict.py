"""Whether mlakit's generated tokens are transformers' tokens: teacher-forced, token by token.

transformers (float32) reads each prompt followed by mlakit's own output; at every generated
position its top token is compared with mlakit's. A position where they differ is a
divergence, and its gap is how far mlakit's token trails transformers' top token in
transformers' logits there. With 16-bit weights and caches a near-tie can flip legitimately,
so the verdict passes when every gap is within the bound stated for the run's dtypes; an
attention kernel that is wrong makes gaps of the size of the logits themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from mlakit.errors import ConfigError

# The largest gap a flip may have, by the KV cache's dtype (the weights are float32 with an fp32
# cache, bf16 on a GPU). The demo model's logits have a spread (std) of ~0.33 and its greedy
# steps' top-two gaps run from 0.01 to 0.11; 16-bit weights and caches move logits by up to
# ~0.01, an e4m3 cache (3 mantissa bits) by up to ~0.04; a wrong kernel moves them by their spread.
GAP_BOUNDS: dict[str, float] = {"fp32": 1e-4, "bf16": 0.02, "fp16": 0.02, "fp8_e4m3": 0.06}


@dataclasses.dataclass(frozen=True)
class Divergence:
    """A generated position where mlakit's token is not transformers' top token."""

    prompt: int
    position: int
    ours: int
    theirs: int
    gap: float


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The comparison of every generated token, and the bound the gaps are held to.

    >>> Verdict(total=4, divergences=(Divergence(0, 2, 7, 9, 0.001),), bound=0.02).passed
    True
    """

    total: int
    divergences: tuple[Divergence, ...]
    bound: float

    def __post_init__(self) -> None:
        if self.total < len(self.divergences) or not self.bound >= 0:
            raise ConfigError(f"a verdict needs total >= divergences and bound >= 0, got {self.total}, "
                              f"{len(self.divergences)} and {self.bound}")

    @property
    def identical(self) -> int:
        return self.total - len(self.divergences)

    @property
    def largest_gap(self) -> float:
        return max((d.gap for d in self.divergences), default=0.0)

    @property
    def passed(self) -> bool:
        return self.largest_gap <= self.bound

    def summary(self) -> str:
        """One line: identical tokens, and for the rest the largest gap against the bound."""
        line = f"{self.identical}/{self.total} tokens identical to transformers"
        if self.divergences and self.passed:
            line += (f"; {len(self.divergences)} differ at near-ties of its logits (largest gap {self.largest_gap:.2g}, "
                     f"bound {self.bound:g})")
        elif self.divergences:
            line += f"; {len(self.divergences)} differ, largest gap {self.largest_gap:.2g} OUTSIDE the bound {self.bound:g}"
        return line


def gap_bound(kv_cache_dtype: str, *attention_dtypes: str | None) -> float:
    """The gap a flipped token may have for a run with this KV cache dtype, and attention computed in
    `attention_dtypes` where a backend's is coarser (None: the cache's): the coarsest one's.

    >>> gap_bound("bf16"), gap_bound("bf16", None, "fp8_e4m3")
    (0.02, 0.06)
    """
    dtypes = [kv_cache_dtype, *(d for d in attention_dtypes if d is not None)]
    unknown = [d for d in dtypes if d not in GAP_BOUNDS]
    if unknown:
        raise ConfigError(f"dtype: expected one of {sorted(GAP_BOUNDS)} (the cache's or an attention's), got "
                          f"{unknown[0]!r}")
    return max(GAP_BOUNDS[d] for d in dtypes)


@torch.no_grad()
def teacher_forced_verdict(
    hf_model: torch.nn.Module, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], bound: float
) -> Verdict:
    """Compares each of `outputs` (mlakit's tokens for `prompts`) with `hf_model`'s top token at
    every position, the model reading the prompt and mlakit's earlier tokens.

    >>> class Echo(torch.nn.Module):  # a stand-in whose top next token is the current token + 1
    ...     def forward(self, ids):
    ...         return type("Out", (), {"logits": torch.nn.functional.one_hot(ids + 1, 16).float()})
    >>> teacher_forced_verdict(Echo(), [[3, 4]], [[5, 6, 9]], bound=0.5).summary()
    '2/3 tokens identical to transformers; 1 differ, largest gap 1 OUTSIDE the bound 0.5'
    """
    if len(prompts) != len(outputs):
        raise ConfigError(f"outputs: expected one per prompt ({len(prompts)}), got {len(outputs)}")
    device = next(iter(hf_model.parameters()), torch.empty(0)).device
    divergences, total = [], 0
    for index, (prompt, output) in enumerate(zip(prompts, outputs)):
        if not output:
            continue
        ids = torch.tensor([[*prompt, *output]], device=device)
        logits = hf_model(ids).logits[0, len(prompt) - 1 : -1].float()
        ours = torch.tensor(output, device=logits.device)
        theirs = logits.argmax(dim=-1)
        gaps = (logits.gather(1, theirs[:, None]) - logits.gather(1, ours[:, None]))[:, 0]
        for position in torch.nonzero(theirs != ours)[:, 0].tolist():
            divergences.append(Divergence(index, position, output[position], int(theirs[position]), float(gaps[position])))
        total += len(output)
    return Verdict(total, tuple(divergences), bound)
