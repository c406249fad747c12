"""Experiments built on fpsim (not part of the installed package)."""
