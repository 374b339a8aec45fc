"""fusethrottle: a FUSE passthrough that turns a slow backup target into back-pressure."""

__version__ = "0.1.0"
