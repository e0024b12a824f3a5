"""Back to HuggingFace, ready to serve: the output directory alone loads in transformers' AutoTokenizer,
AutoModelForCausalLM and text-generation pipeline and reproduces the original's greedy generations; for a
multimodal model, in AutoProcessor, AutoModelForImageTextToText and the image-text-to-text pipeline.

One tiny Qwen3 with its own tokenizer (a word-level tokenizer built here: no download), chat template and generation
config goes to MaxText and back once; every check reads that output. The original's serving files come from where
the conversion read it (recorded in the checkpoint) or from --hf_config_path's directory; with neither at hand the
way back says so, naming what is missing, and writes the weights and config.json alone. One tiny Gemma 3 with its
SigLIP tower and a processor built here (the word-level tokenizer with Gemma 3's image tokens, the image processor's
preprocessor_config.json and processor_config.json as the hub's Gemma 3 repos lay them out) goes there and back once
too.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from typing import Any, NamedTuple

from absl.testing import absltest
import numpy as np

from integration_tests import harness

harness.start_jax()

from tools.testing import tiny_models  # pylint: disable=g-import-not-at-top,g-bad-import-order

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


def assert_copied(test: absltest.TestCase, names: tuple[str, ...]) -> None:
  """`names` are in the way back's output byte for byte, on its `copied:` line, and nothing is said missing."""
  for name in names:
    test.assertTrue(filecmp.cmp(os.path.join(test.original, name), os.path.join(test.back, name), shallow=False),
                    name)
  copied = next(line for line in test.result.stdout.splitlines() if line.startswith("copied:"))
  for name in names:
    test.assertIn(name, copied)
  test.assertNotIn("cannot serve", test.result.stdout + test.result.stderr)


def assert_config_dtype_only(test: absltest.TestCase) -> None:
  """The written config.json is the original's but for the dtype keys, float32."""
  with open(os.path.join(test.original, "config.json")) as f:
    original = json.load(f)
  with open(os.path.join(test.back, "config.json")) as f:
    written = json.load(f)
  changed = {k for k in set(original) | set(written) if original.get(k) != written.get(k)}
  test.assertLessEqual(changed, {"dtype", "torch_dtype"})
  test.assertEqual(written["dtype"], "float32")


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
    assert_copied(self, SERVING)

  def test_config_json_is_the_original_with_only_the_dtype_set(self):
    assert_config_dtype_only(self)

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


# Gemma 3's processor: the word-level tokenizer with Gemma's specials and its image tokens (the placeholder at the id
# MaxText hard-codes, 262144, past the model's 509 rows: transformers replaces it before the lookup), then a word for
# every other id of the model's vocabulary, so that whatever it generates decodes to text.
MM_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
               "<end_of_image>")
MM_WORDS = ("describe", "the", "image", "and", "its", "colours")
MM_SERVING = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
              "processor_config.json", "preprocessor_config.json")
MM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn> {{ message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %} <start_of_image> {% elif item['type'] == 'text' %} {{ item['text'] }} "
    "{% endif %}{% endfor %}{% endif %} <end_of_turn> {% endfor %}{% if add_generation_prompt %}<start_of_turn> model "
    "{% endif %}")


def mm_vocab(vocab_size: int) -> dict[str, int]:
  vocab = {token: i for i, token in enumerate(MM_SPECIALS + MM_WORDS)}
  vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
  vocab["<image_soft_token>"] = 262144
  return vocab


def add_processor(model_dir: str) -> None:
  """Gemma 3's processor, as the hub's Gemma 3 repos lay it out: the tokenizer (its image tokens named in
  tokenizer_config.json), chat_template.jinja, processor_config.json (256 image tokens) and the image processor's
  preprocessor_config.json (64x64, Gemma's normalization, no pan and scan); a greedy 6-token generation config."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(model_dir, "config.json")) as f:
    config = json.load(f)
  vocab = mm_vocab(config["text_config"]["vocab_size"])
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
      extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                            "image_token": "<image_soft_token>"})
  size = config["vision_config"]["image_size"]
  images = transformers.Gemma3ImageProcessorPil(size={"height": size, "width": size}, image_mean=[0.5] * 3,
                                                 image_std=[0.5] * 3, do_pan_and_scan=False)
  transformers.Gemma3Processor(image_processor=images, tokenizer=fast, chat_template=MM_CHAT_TEMPLATE,
                               image_seq_length=config["mm_tokens_per_image"]).save_pretrained(model_dir)
  # transformers 5 nests the image processor in processor_config.json; the hub's Gemma 3 repos (written by
  # transformers 4) keep it in preprocessor_config.json, which AutoProcessor still reads.
  path = os.path.join(model_dir, "processor_config.json")
  with open(path) as f:
    processor = json.load(f)
  image_processor = dict(processor.pop("image_processor"), processor_class=processor["processor_class"])
  for name, content in (("processor_config.json", processor), ("preprocessor_config.json", image_processor)):
    with open(os.path.join(model_dir, name), "w") as f:
      json.dump(content, f, indent=2)
  with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
    json.dump({"do_sample": False, "max_new_tokens": 6, "bos_token_id": vocab["<bos>"], "pad_token_id": vocab["<pad>"],
               "eos_token_id": [vocab["<eos>"], vocab["<end_of_turn>"]]}, f)


def mm_image(seed: int, height: int, width: int) -> Any:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def mm_messages(image: Any, text: str) -> list[dict[str, Any]]:
  return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


class Served(NamedTuple):
  """What transformers does with a multimodal model directory alone (mm_generations)."""

  inputs: dict[str, Any]  # AutoProcessor's tensors for an image + text chat prompt, as numpy arrays.
  prompt: str  # The processor's chat prompt.
  logits: Any  # The model's last-position logits for those inputs,
  blank_logits: Any  # and for the same inputs with a blank image (the tower's part in them).
  ids: list[list[int]]  # AutoModelForImageTextToText.generate's greedy ids for them.
  text: str  # The image-text-to-text pipeline's text for another image and prompt.


def mm_generations(model_dir: str) -> Served:
  """AutoProcessor, AutoModelForImageTextToText and the image-text-to-text pipeline, from `model_dir` alone."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  processor = transformers.AutoProcessor.from_pretrained(model_dir)
  messages = mm_messages(mm_image(0, 40, 56), "describe the image")
  inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")
  model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
  with torch.no_grad():
    logits = model(**inputs).logits[0, -1].numpy()
    blank = model(**dict(inputs, pixel_values=torch.zeros_like(inputs["pixel_values"]))).logits[0, -1].numpy()
    ids = model.generate(**inputs).tolist()  # generation_config.json: greedy, 6 new tokens.
  pipe = transformers.pipeline("image-text-to-text", model=model_dir, dtype=torch.float32)
  text = pipe(text=mm_messages(mm_image(1, 80, 72), "the image and its colours"),
              return_full_text=False)[0]["generated_text"]
  prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  return Served({k: v.numpy() for k, v in inputs.items()}, prompt, logits, blank, ids, text)


class MultimodalServingTest(absltest.TestCase):
  """Gemma 3 with its SigLIP tower: the processor's files travel too, and serve from the output alone."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    original = harness.scratch_dir("serving-mm-hf-")
    # The begin/end-of-image ids within the tokenizer's (and the model's) vocabulary.
    vocab = mm_vocab(tiny_models.config_json("gemma3_mm")["text_config"]["vocab_size"])
    cls.original = tiny_models.build_tiny_model("gemma3_mm", original, boi_token_index=vocab["<start_of_image>"],
                                                eoi_token_index=vocab["<end_of_image>"])
    add_processor(cls.original)
    cls.items = harness.converted(cls.original, "--save_dtype=float32", "--simulated_cpu_devices_count=1")
    cls.back = os.path.join(harness.scratch_dir("serving-mm-back-"), "hf")
    cls.result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={cls.items}",
                                       f"--output_dir={cls.back}")
    cls.expected = mm_generations(cls.original)
    cls.served = mm_generations(cls.back)

  def test_the_processor_files_are_copied_byte_for_byte(self):
    assert_copied(self, MM_SERVING)

  def test_config_json_is_the_original_with_only_the_dtype_set(self):
    assert_config_dtype_only(self)

  def test_the_processor_alone_gives_the_original_inputs(self):
    self.assertEqual(self.served.prompt, self.expected.prompt)
    inputs = self.served.inputs
    self.assertEqual(sorted(inputs), ["attention_mask", "input_ids", "pixel_values", "token_type_ids"])
    for name, value in self.expected.inputs.items():
      np.testing.assert_array_equal(inputs[name], value, err_msg=name)
    self.assertEqual(inputs["pixel_values"].shape, (1, 3, 64, 64))  # preprocessor_config.json's 64x64.
    self.assertEqual(int((inputs["input_ids"] == 262144).sum()), 256)  # processor_config.json's image tokens.
    self.assertEqual(int(inputs["token_type_ids"].sum()), 256)

  def test_the_output_alone_generates_what_the_original_generates(self):
    # The random tiny model's greedy continuations repeat one token; its logits show the image is in play.
    np.testing.assert_allclose(self.served.logits, self.expected.logits, rtol=0, atol=1e-4)
    self.assertGreater(np.abs(self.served.logits - self.served.blank_logits).max(), 0.5)
    self.assertEqual(self.served.ids, self.expected.ids)
    self.assertLen(self.served.ids[0], self.served.inputs["input_ids"].shape[1] + 6)  # generation_config.json: 6.
    self.assertEqual(self.served.text, self.expected.text)
    self.assertLen(self.served.text.split(), 6)  # Every generated id decodes to a word.


if __name__ == "__main__":
  absltest.main()
