"""Backend records, the registry, and start-up resolution of a serving configuration."""

from mlakit.registry.catalog import all_records, backend_names, get_backend, register
from mlakit.registry.records import BackendRecord, PageSizeRule, WorkspaceInputs, WorkspaceSpec

__all__ = [
    "BackendRecord",
    "PageSizeRule",
    "WorkspaceInputs",
    "WorkspaceSpec",
    "all_records",
    "backend_names",
    "get_backend",
    "register",
]
