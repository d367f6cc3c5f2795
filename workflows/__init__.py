"""kvflow workflows."""
