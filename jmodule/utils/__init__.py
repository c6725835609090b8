"""Utilities, as ``torch.utils``: :mod:`jmodule.utils.checkpoint` (activation checkpointing)."""

from jmodule.utils import checkpoint as checkpoint
