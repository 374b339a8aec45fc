"""Metering: each operation priced the way EFS bills it, optional ceilings, the fleet budget."""
