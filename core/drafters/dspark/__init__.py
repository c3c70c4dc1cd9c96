"""DSpark: DFlash's block drafter with a low-rank sequential decoder over the block."""
