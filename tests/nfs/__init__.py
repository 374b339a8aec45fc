"""Tests that run inside the NFS lab VM (python -m bench.nfslab run smoke|correctness)."""
