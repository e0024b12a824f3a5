"""The memory benchmark's measures: the fifths' peaks it judges flatness by, the plot it draws, and the run it
samples (the converter on the bundled tiny checkpoint, its dry run beside it)."""

import json
import os
import tempfile

from absl.testing import absltest, flagsaver

from tools import benchmark_runner, memory_benchmark

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testdata", "tiny-qwen3")


class FifthPeaksTest(absltest.TestCase):

  def test_the_second_and_the_last_fifth(self):
    # 10 s sampled each second: the second fifth is [2, 4), the last [8, 10].
    trace = [(float(t), rss) for t, rss in enumerate([9, 1, 5, 4, 3, 2, 2, 2, 6, 7, 8])]
    self.assertEqual(memory_benchmark.fifth_peaks(trace), (5, 8))

  def test_growth_shows_in_the_ratio(self):
    flat = [(t / 10, 400 + (t % 3)) for t in range(1000)]
    growing = [(t / 10, 400 + t // 10) for t in range(1000)]
    second, last = memory_benchmark.fifth_peaks(flat)
    self.assertLess(last / second, 1.01)
    second, last = memory_benchmark.fifth_peaks(growing)
    self.assertGreater(last / second, 1.1)


class InputOnTmpfsTest(absltest.TestCase):

  def test_whole_shards_largest_first_within_the_budget_left_as_links(self):
    directory, tmpfs = self.create_tempdir().full_path, os.path.join(self.create_tempdir().full_path, "shm")
    sizes = {"model-00001-of-00003.safetensors": 5, "model-00002-of-00003.safetensors": 3,
             "model-00003-of-00003.safetensors": 2}
    for name, size in sizes.items():
      with open(os.path.join(directory, name), "wb") as f:
        f.write(bytes(range(size)))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
      json.dump({"weight_map": {f"t{i}": name for i, name in enumerate(sizes)}}, f)
    moved = memory_benchmark.move_to_tmpfs(directory, tmpfs, budget=7)
    self.assertEqual([os.path.basename(p) for p in moved],
                     ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"])
    for name, size in sizes.items():
      path = os.path.join(directory, name)
      self.assertEqual(os.path.islink(path), os.path.join(tmpfs, name) in moved)
      with open(path, "rb") as f:
        self.assertEqual(f.read(), bytes(range(size)))
    self.assertTrue(memory_benchmark._complete(directory))
    os.remove(moved[0])  # What the end of a run does: the next run must write the input again.
    self.assertFalse(memory_benchmark._complete(directory))


class MeasuredRunTest(absltest.TestCase):

  def test_a_conversion_sampled_with_its_prediction_and_plot(self):
    with tempfile.TemporaryDirectory() as directory, flagsaver.flagsaver(
        results_page=os.path.join(directory, "page.md")):
      os.environ["MPLCONFIGDIR"] = os.path.join(directory, "matplotlib")  # Its font cache: not in ~/.cache.
      output, plot = os.path.join(directory, "out"), os.path.join(directory, "plots", "tiny.png")
      command = [*benchmark_runner.CONVERTER, f"--hf_model_path={TINY}", f"--output_dir={output}", "--noprogress"]
      row = memory_benchmark.measured_run("tiny", command, output, plot)
      self.assertEqual(len(row), len(memory_benchmark.COLUMNS))
      self.assertTrue(os.path.exists(os.path.join(output, "0", "items")))
      with open(plot, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
      peak, predicted = (float(cell.split()[0]) for cell in row[5:7])
      self.assertGreater(peak, 50)  # MiB: a Python process with JAX and Orbax loaded.
      self.assertLess(abs(predicted - peak) / peak, 0.5)
      self.assertEqual(row[-1], "[png](plots/tiny.png)")


if __name__ == "__main__":
  absltest.main()
