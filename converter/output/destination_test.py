"""The resume journal's entries: what both kinds of destination write (local.py, bucket.py) is what --resume reads
back (resume.py), in the format journals of earlier runs were written in."""

import os
import tempfile

from absl.testing import absltest

from converter.output import resume
from converter.output.destination import journal_line
from handlers.write_options import BlockWritten


class JournalLineTest(absltest.TestCase):

  def test_the_entry_is_one_json_line_naming_the_array_and_the_region(self):
    line = journal_line(BlockWritten("params.params.x", (0, 4), (2, 8), nbytes=64))
    self.assertEqual(line, '{"a": "params.params.x", "s": [0, 4], "e": [2, 8]}\n')
    pieces = BlockWritten("params.params.x", (0, 4), (2, 8), 64, (((0, 4), (2, 8), "0p1"),))
    self.assertEqual(journal_line(pieces),
                     '{"a": "params.params.x", "s": [0, 4], "e": [2, 8], "p": [[[0, 4], [2, 8], "0p1"]]}\n')

  def test_resume_reads_back_every_block_written(self):
    blocks = [BlockWritten("params.params.x", (0, 4), (2, 8), 64),
              BlockWritten("params.params.norm", (0,), (5,), 10),
              BlockWritten("params.params.scalar", (), (), 4),  # A 0-d leaf is one block with no axes.
              # Written in pieces, each in a restoring host's database (handlers/host_databases.py).
              BlockWritten("params.params.y", (0, 0), (2, 8), 64, (((0, 0), (2, 4), "0p0"), ((0, 4), (2, 8), "0p1")))]
    path = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "gen-1.journal")
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(journal_line(block) for block in blocks)
    self.assertEqual(resume._load_journal([path]),  # pylint: disable=protected-access
                     [(block.array_name, (block.start, block.stop),
                       tuple(((start, stop), database) for start, stop, database in block.pieces)) for block in blocks])


if __name__ == "__main__":
  absltest.main()
