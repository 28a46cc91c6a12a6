"""Ahead-of-time descriptions of kernel sets: ``KernelSpec`` and the specs of a model config."""
