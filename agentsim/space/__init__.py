"""Spaces: continuous boxes, grids of cells and static networks, behind one protocol (:mod:`.base`)."""
