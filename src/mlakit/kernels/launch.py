"""Kernel launches without Triton's per-call argument binding.

`kernel[grid](*args)` binds and specializes every argument on each call: tens of microseconds
of host time for a kernel of thirty arguments, paid by every layer of every eager step.
`CachedLaunch` pays it once per key the caller names, keeps the compiled kernel, and later
calls with that key launch the compiled binary directly. The key must fix everything Triton
specializes a kernel on (argument dtypes, the values of integer arguments, whether pointers are
16-byte aligned, the constexprs): the launch sites build it from shapes, strides, dtypes and
pointer alignment. Tensors are passed on every call, so nothing that points at memory is kept.

On Triton 3.6 a kernel without scratch memory is launched through its C entry, past the Python launcher
around it; for kernels with TMA descriptor arguments that skips the launcher's loop that expands each
descriptor into a CUDA tensor map (`fill_tma_descriptor`) on every launch: the expansion is kept on the
descriptor object (which `hopper_common.row_descriptors` keeps by address).

With `MLAKIT_VERIFY_LAUNCHES=1` every direct launch first asks Triton which kernel it would run
and raises `StaleLaunchError` if that is not the cached one (the GPU tests run so). Under the CPU
interpreter, or while a launch hook is set (profilers), every call goes through Triton's JIT.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
import threading
import types
from collections.abc import Callable, Hashable, Iterator, Mapping

import triton
from triton import knobs
from triton.runtime import driver

from mlakit.kernels.interpreter import INTERPRET

# Direct launches kept per kernel before the oldest half is dropped (each entry is a few small objects).
MAX_KEYS = 512

# Compile options every launch names rather than leaves to Triton's defaults: the kernels are checked and timed with
# fused multiply-adds, the default that Triton 3.9 warns about when unset and that 3.10 turns off.
COMPILE_OPTIONS: Mapping[str, object] = types.MappingProxyType({"enable_fp_fusion": True})


# Whether direct launches are checked against Triton's own choice (read once, at import).
VERIFY = os.environ.get("MLAKIT_VERIFY_LAUNCHES") == "1"


class StaleLaunchError(RuntimeError):
    """A launch key that does not fix the kernel Triton would compile for the arguments (a launch-site bug)."""


def _hook_set(hook: object) -> bool:
    """Whether a launch hook is installed (Triton keeps them in chains that are empty by default)."""
    return hook is not None and bool(getattr(hook, "calls", True))


@dataclasses.dataclass(frozen=True)
class _RawLaunch:
    """Triton 3.6's C launch entry of one compiled kernel with tensor-descriptor arguments, and where those
    arguments are (their positions and the compiled kernel's metadata for each)."""

    launch: Callable[..., None]
    descriptors: tuple[tuple[int, object], ...]
    cooperative: bool
    pdl: bool


# Held while a rewrite's hook is installed: Triton keeps its pipeline hook in process-wide knobs.
_REWRITE_SCOPE = threading.RLock()


@contextlib.contextmanager
def ptx_rewritten(rewrite: Callable[[str], str] | None) -> Iterator[None]:
    """A scope in which the kernels Triton compiles have `rewrite` run on their PTX before ptxas (a pipeline hook
    after any hook already set, named in Triton's cache keys where Triton asks: 3.7); none without a rewrite. One
    thread at a time holds such a scope; Triton's runtime knobs are restored as they were when it ends.

    >>> def unchanged(ptx: str) -> str:
    ...     return ptx
    >>> from triton import knobs
    >>> with ptx_rewritten(unchanged):
    ...     knobs.runtime.add_stages_inspection_hook()[0].endswith("unchanged")
    True
    """
    if rewrite is None:
        yield
        return
    with _REWRITE_SCOPE, knobs.runtime.scope():
        knobs.runtime.add_stages_inspection_hook = _ptx_rewrite_hook(rewrite, knobs.runtime.add_stages_inspection_hook)
        yield


def _ptx_rewrite_hook(rewrite: Callable[[str], str], previous: Callable[..., object] | None) -> Callable[..., object]:
    """A Triton pipeline hook that runs `previous` (a hook already set), then `rewrite` on the PTX stage's output.
    Triton 3.7 also calls it without arguments for the key and hash it adds to its cache keys. Triton 3.6 does not,
    so a rewrite must change only kernels that say so in their own source or constexprs (which its cache keys name),
    as `l2_evict_first`'s marker does."""
    name = f"{rewrite.__module__}.{getattr(rewrite, '__qualname__', type(rewrite).__qualname__)}"

    def hook(*args: object) -> object:
        if not args:
            key, digest = previous() if previous is not None else ("", "")
            return key + name, hashlib.sha256(f"{digest}{name}".encode()).hexdigest()
        if previous is not None:
            previous(*args)
        stages = args[1]
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: rewrite(make_ptx(src, metadata))
        return None

    return hook


def _raw_launch(compiled: object) -> _RawLaunch | None:
    """Triton 3.6's C launch entry behind `compiled.run` (the launcher itself, or for a kernel with tensor-descriptor
    arguments the C entry inside its descriptor-expanding wrapper) where the kernel needs no scratch memory; None
    otherwise (the kernel is then launched through `compiled.run`)."""
    if not triton.__version__.startswith("3.6."):
        return None
    runner = compiled.run
    wrapper = getattr(runner, "launch", None)
    if wrapper is None or getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1):
        return None
    try:
        captured = inspect.getclosurevars(wrapper).nonlocals
    except TypeError:  # not a Python function: the C launcher of a kernel without descriptor arguments
        return _RawLaunch(wrapper, (), runner.launch_cooperative_grid, runner.launch_pdl)
    if set(captured) != {"launcher", "tensordesc_indices", "tensordesc_meta"} or not captured["tensordesc_meta"]:
        return None
    positions = sorted(captured["tensordesc_indices"])
    return _RawLaunch(captured["launcher"], tuple(zip(positions, captured["tensordesc_meta"])),
                      runner.launch_cooperative_grid, runner.launch_pdl)


def _expanded(descriptor: object, meta: object) -> list:
    """The launcher's arguments for a host TMA descriptor (tensor map, shape, strides), kept on the descriptor
    per kernel argument it fills (`meta`): one descriptor may fill two arguments of one kernel (two boxes of one
    shape over one matrix), each with its own `meta`."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    kept = descriptor.__dict__.setdefault("_launch_arguments", {})
    found = kept.get(id(meta))
    if found is None or found[0] is not meta:
        found = kept[id(meta)] = (meta, make_tensordesc_arg(descriptor, meta))
    return found[1]


class CachedLaunch:
    """Launches of one `@triton.jit` or `@gluon.jit` kernel by key.

    Call it as `launch(key, grid, args, constants)`: `args` are the kernel's leading parameters in
    order, `constants` name the rest (constexprs and launch options such as `num_warps`). The first call
    with a key (per device) goes through `kernel[grid](*args, **constants)`; later calls launch the
    compiled kernel with the new `args` and the first call's constants, on the current stream.

    >>> import triton, triton.language as tl, torch
    >>> @triton.jit
    ... def add_one(X, n, BLOCK: tl.constexpr):
    ...     offsets = tl.arange(0, BLOCK)
    ...     tl.store(X + offsets, tl.load(X + offsets, mask=offsets < n) + 1, mask=offsets < n)
    >>> launch = CachedLaunch(add_one)
    >>> x = torch.zeros(3, device="cuda" if torch.cuda.is_available() else "cpu")
    >>> for _ in range(2):
    ...     launch(("float32", 3), (1, 1, 1), (x, 3), {"BLOCK": 4})
    >>> x.tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(self, kernel: object, ptx_rewrite: Callable[[str], str] | None = None) -> None:
        self.kernel = kernel
        self.ptx_rewrite = ptx_rewrite
        self._parameters = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())
        self._compiled: dict[Hashable, tuple[object, tuple, _RawLaunch | None]] = {}

    def __call__(self, key: Hashable, grid: tuple[int, int, int], args: tuple, constants: Mapping[str, object]) -> None:
        if INTERPRET or _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook):
            with self.compiling():
                self.kernel[grid](*args, **COMPILE_OPTIONS, **constants)
            return
        device = driver.active.get_current_device()
        entry = self._compiled.get((device, key))
        if entry is None:
            with self.compiling():
                compiled = self.kernel[grid](*args, **COMPILE_OPTIONS, **constants)
            if len(self._compiled) >= MAX_KEYS:
                for old in list(self._compiled)[: MAX_KEYS // 2]:
                    del self._compiled[old]
            raw = _raw_launch(compiled)
            if raw is not None and raw.descriptors and raw.descriptors[-1][0] >= len(args):  # passed by name: the plain path
                raw = None
            self._compiled[device, key] = (compiled, self._trailing_values(len(args), constants), raw)
            return
        compiled, trailing, raw = entry
        if VERIFY:
            with self.compiling():
                expected = self.kernel.warmup(*args, grid=grid, **COMPILE_OPTIONS, **constants)
            if expected is not compiled:
                raise StaleLaunchError(f"{self.kernel.__name__}: launch key {key!r} names a kernel compiled for other "
                                       f"arguments than this call's")
        stream = driver.active.get_current_stream(device)
        if raw is None:
            compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args, *trailing)
            return
        flat = args
        if raw.descriptors:
            flat = list(args)
            for position, meta in reversed(raw.descriptors):
                flat[position:position + 1] = _expanded(args[position], meta)
        raw.launch(grid[0], grid[1], grid[2], stream, compiled.function, raw.cooperative, raw.pdl, None, None,
                   compiled.packed_metadata, None, None, None, *flat, *trailing)

    def compiling(self) -> contextlib.AbstractContextManager[None]:
        """The scope in which Triton compiles (or looks up) this kernel: `ptx_rewritten(self.ptx_rewrite)`."""
        return ptx_rewritten(self.ptx_rewrite)

    def _trailing_values(self, positional: int, constants: Mapping[str, object]) -> tuple:
        """The values of the parameters after the positional ones, in order (named or defaulted)."""
        values = []
        for parameter in self._parameters[positional:]:
            if parameter.name in constants:
                values.append(constants[parameter.name])
            elif parameter.default is not inspect.Parameter.empty:
                values.append(parameter.default)
            else:
                raise TypeError(f"{self.kernel.__name__}: parameter {parameter.name} was neither passed nor defaulted")
        return tuple(values)
