"""Batched generation with continuous batching over the paged latent cache.

Each step is either a prefill of newly admitted requests or a decode of every running one
(prefill first, as SGLang schedules), or with `mixed_steps=True` one step holding both: the
running requests' decode tokens and the admitted requests' prompts. A request is admitted only when the free pages hold its
prompt plus `max_new_tokens`, so a running request never runs out of cache; finished requests
free their pages at once for the next ones.

With an fp8 cache, each step reads the layers' saturation counters after sampling (which has
already waited for the step) and warns (FP8SaturationWarning) once per layer whose count grew.

A tensor-parallel model (`DeepseekForCausalLM(..., parallel)`) runs one Runner per rank, each
making the same scheduling decisions; rank 0's sampled tokens are broadcast, so every rank
continues with the same ones. Under decode context parallelism each rank's cache holds its share
of every sequence (`mlakit.model.steps`), and admission counts the fullest rank's pages: every
rank's cache must be made alike (same pages, nothing else held).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from mlakit.cache import FP8Counts, PagedLatentCache
from mlakit.errors import ConfigError, is_int, FP8SaturationWarning
from mlakit.model.deepseek import DeepseekForCausalLM
from mlakit.model.steps import cached_tokens, reserve_step
from mlakit.prefill.metadata import upload_ints
from mlakit.registry.catalog import get_backend
from mlakit.serving.step import DEFAULT_MAX_LATENT_EXTEND_TOKENS


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
        self.check()

    def check(self, name: str = "Request") -> None:
        """Raises ConfigError naming the first bad field as `name.field` (`Runner.generate` passes
        `requests[i]`, so a field changed after construction is caught before any step runs)."""
        prompt = self.prompt_ids
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence) or not prompt:
            raise ConfigError(f"{name}.prompt_ids: expected a non-empty list of token ids, got {prompt!r}")
        bad = next((t for t in prompt if not is_int(t) or t < 0), None)
        if bad is not None:
            raise ConfigError(f"{name}.prompt_ids: expected token ids >= 0, got {bad!r}")
        for field, minimum in (("max_new_tokens", 1), ("seed", 0), ("arrival_step", 0)):
            value = getattr(self, field)
            if not is_int(value) or value < minimum:
                raise ConfigError(f"{name}.{field}: expected an integer >= {minimum}, got {value!r}")
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"{name}.temperature: expected a finite number >= 0 (0: greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"{name}.top_p: expected a number in (0, 1], got {self.top_p!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
        if not isinstance(model, DeepseekForCausalLM):
            raise ConfigError(f"model: expected a DeepseekForCausalLM (mlakit.model.loader.load_model), "
                              f"got {type(model).__name__}")
        if not isinstance(cache, PagedLatentCache):
            raise ConfigError(f"cache: expected a PagedLatentCache, got {type(cache).__name__}")
        if len(cache.stores) != model.config.num_layers:
            raise ConfigError(f"cache has {len(cache.stores)} layers, the model {model.config.num_layers}")
        shape = model.config.attention.shape
        if (cache.kv_lora_rank, cache.rope_dim) != (shape.kv_lora_rank, shape.qk_rope_head_dim):
            raise ConfigError(
                f"cache: expected rows of the model's kv_lora_rank {shape.kv_lora_rank} + qk_rope_head_dim "
                f"{shape.qk_rope_head_dim}, got kv_lora_rank {cache.kv_lora_rank} + rope_dim {cache.rope_dim}"
            )
        if not isinstance(mixed_steps, bool):
            raise ConfigError(f"mixed_steps: expected True or False, got {mixed_steps!r}")
        if not is_int(max_batch_size) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size: expected an integer >= 1, got {max_batch_size!r}")
        for name, backend in (("decode_backend", decode_backend), ("prefill_backend", prefill_backend)):
            if not isinstance(backend, str):
                raise ConfigError(f"{name}: expected a registered backend name or 'auto', got {backend!r}")
            if backend != "auto":
                get_backend(backend)  # raises ConfigError listing the registered names
        self.model = model
        self.cache = cache
        self.decode_backend = decode_backend
        self.prefill_backend = prefill_backend
        self.max_batch_size = max_batch_size
        self.mixed_steps = mixed_steps
        has_extend = decode_backend == "auto" or get_backend(decode_backend).extend is not None
        self._max_latent_extend_tokens = DEFAULT_MAX_LATENT_EXTEND_TOKENS if has_extend else 0
        self.stats = GenerationStats()
        self._fp8_counts = [FP8Counts(0, 0)] * len(cache.stores) if cache.is_fp8 else None

    @torch.no_grad()
    def generate(self, requests: Sequence[Request], on_token: Callable[[], None] | None = None) -> list[list[int]]:
        """Runs every request to EOS or `max_new_tokens`; returns each request's new token ids.

        A request joins at the first step >= its `arrival_step` when pages and batch room allow.
        Every request is checked first (its fields, its token ids against the vocabulary, its
        prompt plus `max_new_tokens` against the free pages): one that could never run fails the
        whole call with a ConfigError naming it, before any step runs or any page is taken. A step
        that raises (e.g. a backend that cannot run here) frees every page the call's requests hold
        before the error propagates, so the cache is as it was.
        """
        self._check_requests(requests)
        if on_token is not None and not callable(on_token):
            raise ConfigError(f"on_token: expected None or a callable taking no arguments, got {on_token!r}")
        try:
            return self._run(requests, on_token)
        except BaseException:
            for index in range(len(requests)):  # sequence ids are request indices (`_check_requests`)
                self.cache.free(index, missing_ok=True)
            raise

    def _run(self, requests: Sequence[Request], on_token: Callable[[], None] | None) -> list[list[int]]:
        """`generate`'s steps over checked requests."""
        waiting = list(range(len(requests)))
        running: list[int] = []
        step_index = 0
        while waiting or running:
            admitted = self._admit(requests, waiting, running, step_index)
            if not admitted and not running:  # idle until the next arrival: skip the empty steps
                step_index = min(requests[i].arrival_step for i in waiting)
                continue
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

    def _check_requests(self, requests: Sequence[Request]) -> None:
        capacity = self.cache.allocator.num_free * self.cache.page_size
        parallel = self.model.parallel
        vocab = self.model.config.vocab_size
        if isinstance(requests, (Request, str, bytes)) or not isinstance(requests, Sequence):
            raise ConfigError(f"requests: expected a list of Request, got {type(requests).__name__}")
        seen: dict[int, int] = {}
        for index, request in enumerate(requests):
            name = f"requests[{index}]"
            if not isinstance(request, Request):
                raise ConfigError(f"{name}: expected a Request, got {type(request).__name__}")
            request.check(name)
            if id(request) in seen:
                raise ConfigError(f"{name}: expected a Request of its own, got the object of requests[{seen[id(request)]}] "
                                  "(generation writes its output_ids and finished)")
            seen[id(request)] = index
            if request.output_ids or request.finished:
                raise ConfigError(f"{name}: expected a fresh Request (no output_ids, not finished), got one with "
                                  f"{len(request.output_ids)} output ids, finished={request.finished}; make a new one")
            if max(request.prompt_ids) >= vocab:
                raise ConfigError(f"{name}.prompt_ids: expected token ids < the vocabulary size {vocab}, got {max(request.prompt_ids)}")
            needed = len(request.prompt_ids) + request.max_new_tokens
            held = cached_tokens(needed, parallel)
            if held > capacity:
                on_rank = f", {held} of them on the fullest DCP rank" if held != needed else ""
                raise ConfigError(
                    f"{name}: needs {needed} tokens of cache ({len(request.prompt_ids)} prompt + {request.max_new_tokens} new{on_rank}), "
                    f"the cache's free pages hold {capacity}; allocate more pages or shorten it"
                )
            if self.cache.pages_of(index) or self.cache.seq_len(index):
                raise ConfigError(f"{name}: the cache already holds sequence {index} (the runner uses request indices as sequence ids); free it first")

    def _admit(self, requests: Sequence[Request], waiting: list[int], running: list[int], step_index: int) -> list[int]:
        admitted = []
        free_pages = self.cache.allocator.num_free - sum(self._pages_still_needed(requests[i], i) for i in running)
        for index in list(waiting):
            request = requests[index]
            if request.arrival_step > step_index or len(running) + len(admitted) >= self.max_batch_size:
                continue
            pages = self._pages_for(request)
            if pages > free_pages:
                break
            free_pages -= pages
            admitted.append(index)
            waiting.remove(index)
        return admitted

    def _pages_for(self, request: Request) -> int:
        """The pages the request holds at its longest, on the fullest rank."""
        tokens = cached_tokens(len(request.prompt_ids) + request.max_new_tokens, self.model.parallel)
        return -(-tokens // self.cache.page_size)

    def _pages_still_needed(self, request: Request, index: int) -> int:
        return self._pages_for(request) - len(self.cache.pages_of(index))

    def _run_step(self, requests: Sequence[Request], decoding: list[int], prefilling: list[int]) -> None:
        device = self.cache.device
        indices = decoding + prefilling
        tokens, positions, starts, new_counts = [], [], [], []
        for index in indices:
            request = requests[index]
            new = request.prompt_ids if index in prefilling else request.output_ids[-1:]
            start = 0 if index in prefilling else len(request.prompt_ids) + len(request.output_ids) - 1
            tokens.extend(new)
            positions.extend(range(start, start + len(new)))
            starts.append(start)
            new_counts.append(len(new))
        step = reserve_step(
            self.cache, self.model.parallel, indices, starts, new_counts,
            heads=self.model.config.attention.shape.num_heads, max_latent_extend_tokens=self._max_latent_extend_tokens,
        )
        began = time.perf_counter()
        logits = self.model(
            upload_ints(tokens, device, torch.int64), upload_ints(positions, device, torch.int64), step, self.cache,
            decode_backend=self.decode_backend, prefill_backend=self.prefill_backend,
            check_inputs=False,  # the steps' tables and lengths come from this runner's own allocator
        )
        sampled = [sample(logits[row], requests[index], len(requests[index].output_ids)) for row, index in enumerate(indices)]
        for index, token in zip(indices, self._agreed(sampled)):
            request = requests[index]
            request.output_ids.append(token)
            eos = token in self.model.config.eos_token_ids
            request.finished = eos or len(request.output_ids) >= request.max_new_tokens
        if self._fp8_counts is not None:
            self._warn_on_fp8_saturation()
        if prefilling:
            self.stats.prefill_steps += 1
        else:
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(indices)
            self.stats.decode_seconds += time.perf_counter() - began

    def _agreed(self, sampled: list[int]) -> list[int]:
        """Rank 0's tokens on every TP rank (one small broadcast), so the ranks never diverge."""
        parallel = self.model.parallel
        if parallel is None or parallel.tp_size == 1:
            return sampled
        tokens = torch.tensor(sampled, dtype=torch.int64, device=self.cache.device)
        dist.broadcast(tokens, src=dist.get_global_rank(parallel.tp_group, 0), group=parallel.tp_group)
        return tokens.tolist()

    def _warn_on_fp8_saturation(self) -> None:
        """One FP8SaturationWarning per layer whose saturated or non-finite count grew this step."""
        counts = self.cache.fp8_saturation_counts()
        for layer, (now, before) in enumerate(zip(counts, self._fp8_counts)):
            problems = []
            if now.saturated > before.saturated:
                problems.append(
                    f"{now.saturated - before.saturated} latent values saturated at +-448 ({now.saturated} in all); "
                    "use a larger fp8_scale, fp8_scale='auto' or calibrate_fp8_scale, or scale_layout='group'"
                )
            if now.non_finite > before.non_finite:
                problems.append(
                    f"{now.non_finite - before.non_finite} non-finite latent values (inf or NaN) stored as NaN "
                    f"({now.non_finite} in all); the model's activations overflowed before the cache write"
                )
            if problems:
                warnings.warn(f"fp8 KV cache layer {layer}: " + "; ".join(problems), FP8SaturationWarning, stacklevel=2)
        self._fp8_counts = counts


def sample(logits: torch.Tensor, request: Request, position: int) -> int:
    """Greedy (temperature 0) or temperature / top-p sampling, reproducible per request and position."""
    if request.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / request.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(0) - sorted_probs < request.top_p
    sorted_probs = torch.where(keep, sorted_probs, 0)
    generator = torch.Generator(device="cpu").manual_seed((request.seed * 1_000_003 + position) % 2**64)
    choice = torch.multinomial(sorted_probs.cpu(), 1, generator=generator)
    return int(order[choice.to(order.device)])
