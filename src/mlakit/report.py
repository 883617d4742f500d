"""Human-readable rendering of plans."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from mlakit.plan import Plan


def print_plan(plan: Plan, console: Console) -> None:
    """A readable summary of a plan and its notes."""
    table = Table(title="mlakit plan", show_header=False)
    table.add_column("setting")
    table.add_column("value")
    for key, value in plan.to_dict().items():
        if key in ("notes", "workspaces", "device", "warmup"):
            continue
        table.add_row(key, str(value))
    table.add_row("device", f"{plan.device.name} ({plan.device.arch}{'' if plan.device.local else ', hypothetical'})")
    for w in plan.workspaces:
        table.add_row(f"workspace {w.family}", f"{w.nbytes / 2**20:.1f} MiB for {', '.join(w.backends)}: {w.formula}")
    if plan.warmup is not None:
        table.add_row("warm-up", f"{plan.warmup.seconds:.2f} s, {len(plan.warmup.calls)} kernel calls before the first request")
    console.print(table)
    for note in plan.notes:
        console.print(f"  note: {note}", highlight=False, soft_wrap=True)
