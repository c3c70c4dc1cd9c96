"""DFlash: a block drafter that drafts a whole block in one forward from target features."""
