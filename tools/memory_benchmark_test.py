"""The memory benchmark's measures: the fifths' peaks it judges flatness by, the plot it draws, and the run it
samples (the converter on the bundled tiny checkpoint, its dry run beside it)."""

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
