"""Kernel launches without Triton's per-call argument binding.

`kernel[grid](*args)` binds and specializes every argument on each call: tens of microseconds
of host time for a kernel of thirty arguments, paid by every layer of every eager step.
`CachedLaunch` pays it once per key the caller names, keeps the compiled kernel, and later
calls with that key launch the compiled binary directly. The key must fix everything Triton
specializes a kernel on (argument dtypes, the values of integer arguments, whether pointers are
16-byte aligned, the constexprs): the launch sites build it from shapes, strides, dtypes and
pointer alignment. Tensors are passed on every call, so nothing that points at memory is kept.

With `MLAKIT_VERIFY_LAUNCHES=1` every direct launch first asks Triton which kernel it would run
and raises `StaleLaunchError` if that is not the cached one (the GPU tests run so). Under the CPU
interpreter, or while a launch hook is set (profilers), every call goes through Triton's JIT.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Hashable

from triton import knobs
from triton.runtime import driver

from mlakit.kernels.interpreter import INTERPRET

# Direct launches kept per kernel before the oldest half is dropped (each entry is a few small objects).
MAX_KEYS = 512


class StaleLaunchError(RuntimeError):
    """A launch key that does not fix the kernel Triton would compile for the arguments (a launch-site bug)."""


def verifying() -> bool:
    """Whether direct launches are checked against Triton's own choice (`MLAKIT_VERIFY_LAUNCHES=1`)."""
    return os.environ.get("MLAKIT_VERIFY_LAUNCHES") == "1"


def launch_hooks_set() -> bool:
    """Whether a launch hook is installed (Triton keeps them in chains that are empty by default)."""
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class CachedLaunch:
    """Launches of one `@triton.jit` or `@gluon.jit` kernel by key.

    Call it as `launch(key, grid, *args, **constants)`: `args` are the kernel's leading parameters in
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
    ...     launch(("float32", 3), (1, 1, 1), x, 3, BLOCK=4)
    >>> x.tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self._parameters = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())
        self._compiled: dict[Hashable, tuple[object, tuple]] = {}

    def __call__(self, key: Hashable, grid: tuple[int, int, int], *args: object, **constants: object) -> None:
        if INTERPRET or launch_hooks_set():
            self.kernel[grid](*args, **constants)
            return
        device = driver.active.get_current_device()
        entry = self._compiled.get((device, key))
        if entry is None:
            compiled = self.kernel[grid](*args, **constants)
            if len(self._compiled) >= MAX_KEYS:
                for old in list(self._compiled)[: MAX_KEYS // 2]:
                    del self._compiled[old]
            self._compiled[device, key] = (compiled, self._trailing_values(len(args), constants))
            return
        compiled, trailing = entry
        if verifying():
            expected = self.kernel.warmup(*args, grid=grid, **constants)
            if expected is not compiled:
                raise StaleLaunchError(f"{self.kernel.__name__}: launch key {key!r} names a kernel compiled for other "
                                       f"arguments than this call's")
        compiled.run(grid[0], grid[1], grid[2], driver.active.get_current_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *trailing)

    def _trailing_values(self, positional: int, constants: dict[str, object]) -> tuple:
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
