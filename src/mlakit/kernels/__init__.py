"""Triton kernels. Importing a kernel module needs triton; the registry records and `seesaw_layout` (which caches the
persistent decode kernel reads, in plain ints) do not."""
