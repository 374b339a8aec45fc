"""What the daemon shows: Prometheus metrics, `fusethrottle status`, the data-path events."""
