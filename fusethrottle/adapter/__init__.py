"""The FUSE adapter: requests in, replies out, and what the daemon tells the kernel of its
caches."""
