"""Layout: each leaf's MaxText logical axes (logical_axes.py), where its stored chunks are cut for the
restoring mesh (chunking.py), and what a stored checkpoint's chunks cost a mesh (layout_inspection.py)."""
