"""The sync layer: how a peer that was away catches up (see the sync layer in the design)."""
