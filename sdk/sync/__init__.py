"""Sync layer: protocols by which peers that were apart catch up (see the modules)."""
