"""Triton kernels. Importing a kernel module needs triton; the registry records do not."""
