"""Back to HuggingFace, ready to serve: the output directory alone loads in transformers' AutoTokenizer,
AutoModelForCausalLM and text-generation pipeline and reproduces the original's greedy generations.

One tiny Qwen3 with its own tokenizer (a word-level tokenizer built here: no download), chat template and generation
config goes to MaxText and back once; every check reads that output. The original's serving files come from where
the conversion read it (recorded in the checkpoint) or from --hf_config_path's directory; with neither at hand the
way back says so, naming what is missing, and writes the weights and config.json alone.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

from tools import tiny_models  # pylint: disable=g-import-not-at-top,g-bad-import-order

WORDS = ("the", "model", "serves", "tokens", "from", "its", "own", "directory", "hello", "world", "again", "and")
SERVING = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def add_tokenizer(model_dir: str) -> None:
  """A word-level tokenizer over WORDS and a few specials, its chat template and a generation config that is not
  transformers' default (greedy, 6 new tokens, its own end token)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  specials = ["<unk>", "<pad>", "<s>", "<|end|>", "<|user|>", "<|assistant|>"]
  vocab = {token: i for i, token in enumerate(specials + list(WORDS))}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                              bos_token="<s>", eos_token="<|end|>")
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(model_dir)
  with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
    json.dump({"do_sample": False, "max_new_tokens": 6, "eos_token_id": vocab["<|end|>"], "pad_token_id": 1}, f)


def generations(model_dir: str) -> tuple[list[list[int]], str, str]:
  """Greedy ids of generate, the pipeline's text and the chat prompt, all from `model_dir` alone."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  inputs = tokenizer(["the model serves", "hello world"], return_tensors="pt", padding=True)
  with torch.no_grad():
    ids = model.generate(**inputs).tolist()  # generation_config.json: greedy, 6 new tokens.
  pipe = transformers.pipeline("text-generation", model=model_dir, dtype=torch.float32)
  text = pipe("tokens from its own", return_full_text=True)[0]["generated_text"]
  prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello again"}], tokenize=False,
                                         add_generation_prompt=True)
  return ids, text, prompt


class ServingTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.original = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("serving-hf-"))
    add_tokenizer(cls.original)
    cls.items = harness.converted(cls.original, "--save_dtype=float32", "--simulated_cpu_devices_count=1")
    cls.back = os.path.join(harness.scratch_dir("serving-back-"), "hf")
    cls.result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={cls.items}",
                                       f"--output_dir={cls.back}")

  def test_the_original_serving_files_are_copied_byte_for_byte(self):
    for name in SERVING:
      self.assertTrue(filecmp.cmp(os.path.join(self.original, name), os.path.join(self.back, name), shallow=False),
                      name)
    copied = next(line for line in self.result.stdout.splitlines() if line.startswith("copied:"))
    for name in SERVING:
      self.assertIn(name, copied)
    self.assertNotIn("cannot serve", self.result.stdout + self.result.stderr)

  def test_config_json_is_the_original_with_only_the_dtype_set(self):
    with open(os.path.join(self.original, "config.json")) as f:
      original = json.load(f)
    with open(os.path.join(self.back, "config.json")) as f:
      written = json.load(f)
    changed = {k for k in set(original) | set(written) if original.get(k) != written.get(k)}
    self.assertLessEqual(changed, {"dtype", "torch_dtype"})
    self.assertEqual(written["dtype"], "float32")

  def test_the_output_alone_generates_what_the_original_generates(self):
    ids, text, prompt = generations(self.back)
    self.assertEqual((ids, text, prompt), generations(self.original))
    self.assertEqual(prompt, "<|user|> hello again <|end|> <|assistant|>")
    self.assertLen(ids[0], 3 + 6)  # The prompt, then generation_config.json's 6 greedy tokens.

  def test_without_the_original_it_says_what_is_missing_and_writes_the_model(self):
    moved = harness.scratch_dir("serving-moved-")
    model_dir = shutil.copytree(self.original, os.path.join(moved, "model"))
    items = harness.converted(model_dir, "--save_dtype=float32", "--simulated_cpu_devices_count=1")
    shutil.rmtree(model_dir)
    back = os.path.join(harness.scratch_dir("serving-alone-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}",
                                   f"--output_dir={back}")
    self.assertIn(f"warning:       {model_dir}: the original model is not there", result.stdout)
    self.assertIn("the output holds config.json and the weights only", result.stdout)
    self.assertEqual(sorted(os.listdir(back)), ["config.json", "model.safetensors"])
    # --hf_config_path names another copy of the original: its serving files are copied from there.
    again = os.path.join(harness.scratch_dir("serving-again-"), "hf")
    harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={again}",
                          f"--hf_config_path={self.original}")
    self.assertContainsSubset(SERVING, os.listdir(again))


if __name__ == "__main__":
  absltest.main()
