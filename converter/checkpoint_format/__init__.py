"""The checkpoint's format, below everything that reads or writes one: where Orbax puts a step's pieces
(layout.py), the conversion record in its metadata (record.py) and the original model it names (original.py)."""
