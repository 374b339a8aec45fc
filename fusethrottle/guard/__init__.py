"""The pressure guard: the backup yields to the protected workload's own stall (PSI)."""
