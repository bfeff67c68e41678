"""Shared run plumbing of the cleanrl-q scripts (cleanrl/); see plumbing.py."""
