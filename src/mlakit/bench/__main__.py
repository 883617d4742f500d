"""`python -m mlakit.bench decode ...`."""

from mlakit.bench.cli import bench

bench()
