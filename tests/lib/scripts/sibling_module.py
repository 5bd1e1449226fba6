"""Imported by mutate_state.py from the same folder."""

VALUE = "sibling imported"
