"""The service: command line, options, a mount's parts, start-up, serving, shutdown, systemd."""
