"""Batched generation with continuous batching over the paged latent cache.

Each step is either a prefill of newly admitted requests or a decode of every running one
(prefill first, as SGLang schedules), or with `mixed_steps=True` one step holding both: the
running requests' decode tokens and the admitted requests' prompts. A request is admitted only when the free pages hold its
prompt plus `max_new_tokens`, so a running request never runs out of cache; finished requests
free their pages at once for the next ones.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from mlakit.cache import PagedLatentCache
from mlakit.errors import ConfigError
from mlakit.model.deepseek import DeepseekForCausalLM
from mlakit.registry.catalog import get_backend
from mlakit.step import DEFAULT_MAX_LATENT_EXTEND_TOKENS, AttentionStep


@dataclasses.dataclass
class Request:
    """One generation request; `temperature=0` is greedy, else sampling with `top_p` and `seed`."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    arrival_step: int = 0
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finished: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ConfigError("prompt_ids must hold at least one token")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature} and {self.top_p}")


@dataclasses.dataclass
class GenerationStats:
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0


class Runner:
    """Runs requests through a model and its paged cache.

    `Runner(model, cache, decode_backend=plan.decode_backend).generate([Request([1, 2, 3], max_new_tokens=8)])`
    returns each request's new token ids (the README's "Running a model" has the whole set-up).
    """

    def __init__(
        self,
        model: DeepseekForCausalLM,
        cache: PagedLatentCache,
        *,
        decode_backend: str = "auto",
        prefill_backend: str = "auto",
        max_batch_size: int = 64,
        mixed_steps: bool = False,
    ) -> None:
        if len(cache.stores) != model.config.num_layers:
            raise ConfigError(f"cache has {len(cache.stores)} layers, the model {model.config.num_layers}")
        self.model = model
        self.cache = cache
        self.decode_backend = decode_backend
        self.prefill_backend = prefill_backend
        self.max_batch_size = max_batch_size
        self.mixed_steps = mixed_steps
        has_extend = decode_backend == "auto" or get_backend(decode_backend).extend is not None
        self._max_latent_extend_tokens = DEFAULT_MAX_LATENT_EXTEND_TOKENS if has_extend else 0
        self.stats = GenerationStats()

    @torch.no_grad()
    def generate(self, requests: Sequence[Request], on_token: Callable[[], None] | None = None) -> list[list[int]]:
        """Runs every request to EOS or `max_new_tokens`; returns each request's new token ids.

        A request joins at the first step >= its `arrival_step` when pages and batch room allow.
        """
        capacity = self.cache.allocator.num_pages * self.cache.page_size
        for request in requests:
            if len(request.prompt_ids) + request.max_new_tokens > capacity:
                raise ConfigError(
                    f"a request needs {len(request.prompt_ids) + request.max_new_tokens} tokens of cache, "
                    f"the cache holds {capacity}; allocate more pages"
                )
        waiting = list(range(len(requests)))
        running: list[int] = []
        step_index = 0
        while waiting or running:
            admitted = self._admit(requests, waiting, running, step_index)
            if admitted and self.mixed_steps:
                self._run_step(requests, decoding=list(running), prefilling=admitted)
                running.extend(admitted)
            elif admitted:
                self._run_step(requests, decoding=[], prefilling=admitted)
                running.extend(admitted)
            elif running:
                self._run_step(requests, decoding=list(running), prefilling=[])
            for index in [i for i in running if requests[i].finished]:
                running.remove(index)
                self.cache.free(index)
            if on_token is not None:
                on_token()
            step_index += 1
        return [r.output_ids for r in requests]

    def _admit(self, requests: Sequence[Request], waiting: list[int], running: list[int], step_index: int) -> list[int]:
        admitted = []
        free_pages = self.cache.allocator.num_free - sum(self._pages_still_needed(requests[i], i) for i in running)
        for index in list(waiting):
            request = requests[index]
            if request.arrival_step > step_index or len(running) + len(admitted) >= self.max_batch_size:
                continue
            pages = -(-(len(request.prompt_ids) + request.max_new_tokens) // self.cache.page_size)
            if pages > free_pages:
                break
            free_pages -= pages
            admitted.append(index)
            waiting.remove(index)
        return admitted

    def _pages_still_needed(self, request: Request, index: int) -> int:
        total = -(-(len(request.prompt_ids) + request.max_new_tokens) // self.cache.page_size)
        return total - len(self.cache.pages_of(index))

    def _run_step(self, requests: Sequence[Request], decoding: list[int], prefilling: list[int]) -> None:
        device = self.cache.device
        indices = decoding + prefilling
        tokens, positions, new_counts = [], [], []
        for index in indices:
            request = requests[index]
            new = request.prompt_ids if index in prefilling else request.output_ids[-1:]
            start = self.cache.seq_len(index)
            tokens.extend(new)
            positions.extend(range(start, start + len(new)))
            new_counts.append(len(new))
        slots = torch.cat([self.cache.reserve(index, n) for index, n in zip(indices, new_counts)])
        step = AttentionStep(
            tuple(new_counts), tuple(self.cache.seq_len(i) for i in indices), self.cache.block_table(indices), slots,
            page_size=self.cache.page_size, heads=self.model.config.attention.shape.num_heads,
            max_latent_extend_tokens=self._max_latent_extend_tokens,
        )
        began = time.perf_counter()
        logits = self.model(
            torch.tensor(tokens, device=device), torch.tensor(positions, device=device), step, self.cache,
            decode_backend=self.decode_backend, prefill_backend=self.prefill_backend,
        )
        for row, index in enumerate(indices):
            request = requests[index]
            token = sample(logits[row], request, len(request.output_ids))
            request.output_ids.append(token)
            eos = token in self.model.config.eos_token_ids
            request.finished = eos or len(request.output_ids) >= request.max_new_tokens
        if prefilling:
            self.stats.prefill_steps += 1
        else:
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(indices)
            self.stats.decode_seconds += time.perf_counter() - began


def sample(logits: torch.Tensor, request: Request, position: int) -> int:
    """Greedy (temperature 0) or temperature / top-p sampling, reproducible per request and position."""
    if request.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / request.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(0) - sorted_probs < request.top_p
    sorted_probs = torch.where(keep, sorted_probs, 0)
    generator = torch.Generator(device="cpu").manual_seed(request.seed * 1_000_003 + position)
    choice = torch.multinomial(sorted_probs.cpu(), 1, generator=generator)
    return int(order[choice.to(order.device)])
