"""Embedded KVFlow engine in plain torch."""
