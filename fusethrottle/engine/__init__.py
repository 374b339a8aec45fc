"""The native engine: the FUSE request loop in C++ on libfuse3 (src/), loaded by native.py."""
