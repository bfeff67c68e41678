"""Single-file value-based deep RL algorithms. Each module in this package is a standalone script."""
