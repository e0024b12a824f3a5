"""Everything under OUTPUT_DIR, owned per direction: maxtext.py (to MaxText) and huggingface.py (back to HF).

Below them: the kind of storage, chosen once per output (destinations.py: local.py or bucket.py, each a
destination.py `Destination`), the lock (lock.py), resuming (resume.py), the Orbax save (orbax_writer.py) and the
conversion record it writes (record.py; the step's layout and the record's schema are converter/checkpoint_format's).
Nothing outside this package tests whether a path is a bucket, except `storage`.
"""
