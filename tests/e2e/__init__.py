"""Cross-component end-to-end tests (SDK runtime + transports + store node)."""
