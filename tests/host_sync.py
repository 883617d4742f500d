"""A guard for the tests that a GPU path makes no host-device sync."""

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def forbidding_host_syncs() -> Iterator[None]:
    """Inside, any host-device sync raises (torch's sync debug mode "error"); the GPU is idle on entry.

    Example: `with forbidding_host_syncs(): store.write_slots(slots, rows, check_values=False)`.
    """
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
