"""One module per attack."""
