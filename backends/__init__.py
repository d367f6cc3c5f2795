"""kvflow backends."""
