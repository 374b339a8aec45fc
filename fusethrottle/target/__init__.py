"""The target: every call against the backing directory, in worker threads, as the caller."""
