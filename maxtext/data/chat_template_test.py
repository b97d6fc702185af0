"""Tests for maxtext.data.chat_template against Hugging Face transformers."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import tokenizers
from tokenizers import models as tokenizer_models
import transformers

from maxtext.data import assets
from maxtext.data import chat_template
from maxtext.data import tokenizer as tokenizer_lib

_CONVERSATION = [
    {"role": "user", "content": "Who's there?"},
    {"role": "assistant", "content": "Nay, answer me: stand, and unfold"
                                     " yourself."},
    {"role": "user", "content": "Long live the king!"},
    {"role": "assistant", "content": "Bernardo?"},
]
_SYSTEM = [{"role": "system", "content": "You are Francisco."}]


def _hf_tokenizer() -> transformers.PreTrainedTokenizerFast:
  """A tokenizer whose BOS/EOS text matches the Mistral one's."""
  backend = tokenizers.Tokenizer(tokenizer_models.WordLevel(
      vocab={"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
      unk_token="<unk>")


class ChatTemplateTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.default_tokenizer())

  @parameterized.product(name=sorted(chat_template.TEMPLATES),
                         generation_prompt=(False, True))
  def test_renders_like_transformers(self, name, generation_prompt):
    source = chat_template.TEMPLATES[name]
    encoder = chat_template.ChatEncoder(source, self.tok)
    messages = _CONVERSATION
    if name in ("chatml", "llama3"):
      messages = _SYSTEM + messages
    if generation_prompt:
      messages = messages[:-1]
    expected = _hf_tokenizer().apply_chat_template(
        messages, chat_template=source, tokenize=False,
        add_generation_prompt=generation_prompt)
    self.assertEqual(
        encoder.render(messages, add_generation_prompt=generation_prompt),
        expected)

  @parameterized.parameters(*sorted(chat_template.TEMPLATES))
  def test_only_assistant_turns_are_weighted(self, name):
    encoder = chat_template.ChatEncoder(chat_template.TEMPLATES[name],
                                        self.tok)
    pieces = encoder.pieces(_CONVERSATION)
    self.assertEqual("".join(text for text, _ in pieces),
                     encoder.render(_CONVERSATION))
    assistant = [text for text, is_assistant in pieces if is_assistant]
    self.assertLen(assistant, 2)
    for text, message in zip(assistant, _CONVERSATION[1::2]):
      self.assertTrue(text.startswith(message["content"]), (text, message))
    ids, weights = encoder.encode(_CONVERSATION)
    self.assertLen(weights, len(ids))
    weighted = [i for i, w in zip(ids, weights) if w]
    expected = []
    for text in assistant:
      expected += encoder._encode(text)  # pylint: disable=protected-access
    self.assertEqual(weighted, expected)
    if "eos_token" in chat_template.TEMPLATES[name]:
      # BOS/EOS written by the template become their ids, not text.
      self.assertEqual(ids.count(self.tok.eos_id), 2)
    if "bos_token" in chat_template.TEMPLATES[name]:
      self.assertEqual(ids[0], self.tok.bos_id)

  def test_special_token_text_in_a_message_stays_text(self):
    # SentencePiece (the template writes BOS/EOS as text) and tiktoken GPT-2
    # (its <|endoftext|> special token); the template's own markup keeps
    # its ids, a message's literal copy of it does not.
    gpt2 = tokenizer_lib.load_tokenizer(assets.gpt2_tiktoken())
    for tok, template, literal in (
        (self.tok, "mistral", "</s>"),
        (gpt2, "{% for m in messages %}{{ m['content'] }}<|endoftext|>"
               "{% endfor %}", "<|endoftext|>")):
      source = chat_template.TEMPLATES.get(template, template)
      encoder = chat_template.ChatEncoder(source, tok)
      special = [tok.eos_id]  # Both literals spell the EOS token.
      self.assertEqual(tok.special_text(tok.eos_id), literal)
      plain = [{"role": "user", "content": "Say it."},
               {"role": "assistant", "content": "Done."}]
      typed = [plain[0], {"role": "assistant",
                          "content": f"Done.{literal} Not the end"}]
      want_ids = encoder.encode(plain)[0].count(special[0])
      ids, weights = encoder.encode(typed)
      self.assertEqual(ids.count(special[0]), want_ids, template)
      # The literal is there, as its plain-text tokens.
      text_ids = tok.encode(literal)
      self.assertTrue(any(ids[i:i + len(text_ids)] == text_ids
                          for i in range(len(ids))), (template, ids))
      self.assertLen(weights, len(ids))
    # A template that cuts a content apart: encoded as before, its markup
    # still the EOS id.
    cutting = chat_template.ChatEncoder(
        "{% for m in messages %}{{ m['content'].split('|')[-1] }}</s>"
        "{% endfor %}", self.tok)
    ids, _ = cutting.encode([{"role": "user", "content": "a|b"},
                             {"role": "assistant", "content": "c|d"}])
    self.assertEqual(ids.count(self.tok.eos_id), 2)
    self.assertEqual(self.tok.decode(ids).replace(" ", ""), "bd")
    # Without a literal, the ids are the whole pieces' as before.
    encoder = chat_template.ChatEncoder(chat_template.TEMPLATES["mistral"],
                                        self.tok)
    ids, _ = encoder.encode(_CONVERSATION)
    want = []
    for text, _ in encoder.pieces(_CONVERSATION):
      want += encoder._encode(text)  # pylint: disable=protected-access
    self.assertEqual(ids, want)

  def test_template_errors_are_clear(self):
    encoder = chat_template.ChatEncoder(chat_template.TEMPLATES["mistral"],
                                        self.tok)
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "roles must alternate"):
      encoder.encode(_CONVERSATION[1:])
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "no assistant message"):
      encoder.encode(_CONVERSATION[:1])
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "message 0 is not"):
      encoder.encode([{"role": "user"}])
    # A template that renders the latest message differently is refused.
    unstable = chat_template.ChatEncoder(
        "{% for m in messages %}{{ m['content'] if loop.last else '.' }}"
        "{% endfor %}", self.tok)
    with self.assertRaisesRegex(chat_template.ChatTemplateError, "prefix"):
      unstable.encode(_CONVERSATION)

  def test_load_template_from_files(self):
    folder = self.create_tempdir().full_path
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path, "w") as f:
      json.dump({"chat_template": chat_template.TEMPLATES["chatml"]}, f)
    self.assertEqual(chat_template.load_template(config_path),
                     chat_template.TEMPLATES["chatml"])
    jinja_path = os.path.join(folder, "chat.jinja")
    with open(jinja_path, "w") as f:
      f.write("{{ messages[0]['content'] }}")
    self.assertEqual(chat_template.load_template(jinja_path),
                     "{{ messages[0]['content'] }}")
    self.assertEqual(chat_template.load_template("gemma"),
                     chat_template.TEMPLATES["gemma"])
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "'vicuna'.*'chatml'"):
      chat_template.load_template("vicuna")


class ImagePartsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.default_tokenizer())
    self.image_ids = [7, 8, 8, 9]
    self.encoder = chat_template.ChatEncoder(
        chat_template.TEMPLATES["gemma"], self.tok)
    self.both_images = [self.image_ids] * 2
    self.parts = [{"type": "image", "path": "a.png"},
                  {"type": "image", "image": b"\x89PNG"}]
    self.messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "Look:"}, self.parts[0],
            {"type": "text", "text": "and"}, self.parts[1],
            {"type": "text", "text": "What differs?"}]},
        {"role": "assistant", "content": "The colour."}]

  def test_images_become_their_ids_untrained(self):
    ids, weights = self.encoder.encode(self.messages, self.both_images)
    starts = [i for i in range(len(ids))
              if ids[i:i + len(self.image_ids)] == self.image_ids]
    self.assertLen(starts, 2)
    for start in starts:
      self.assertEqual(weights[start:start + 4], [0] * 4)
    # Around the images, the ids of the text as the template renders it.
    without = [token for i, token in enumerate(ids)
               if not any(s <= i < s + 4 for s in starts)]
    self.assertEqual(self.tok.decode(without).replace(" ", ""),
                     self.encoder.render([
                         {"role": "user", "content": "Look:andWhat differs?"},
                         self.messages[1]]).replace(" ", "").replace(
                             "<bos>", "").replace("<s>", ""))
    _, text_weights = self.encoder.encode([
        {"role": "user", "content": "Look: and What differs?"},
        self.messages[1]])
    self.assertEqual(sum(weights), sum(text_weights))
    self.assertEqual(chat_template.image_parts(self.messages), self.parts)

  def test_each_image_its_own_ids(self):
    """Ids that depend on the image (Llama 4's tiles) take each image part's
    place in order; a count that differs from the parts' is refused."""
    per_image = [[7, 8, 9], [7, 8, 8, 8, 8, 9]]
    ids, weights = self.encoder.encode(self.messages, per_image)
    self.assertEqual(ids.count(8), 5)
    self.assertEqual([weights[i] for i, t in enumerate(ids) if t == 8],
                     [0] * 5)
    prompt = self.encoder.prompt(self.messages[:1], per_image)
    self.assertEqual(prompt.count(8), 5)
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "1 images' ids given for 2 image parts"):
      self.encoder.encode(self.messages, per_image[:1])

  def test_prompt(self):
    ids = self.encoder.prompt(self.messages[:1], self.both_images)
    self.assertEqual(ids.count(7), 2)
    self.assertTrue(self.tok.decode(ids).rstrip().endswith(
        "<start_of_turn>model"), self.tok.decode(ids))

  def test_errors(self):
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "images are off"):
      self.encoder.encode(self.messages)
    with self.assertRaisesRegex(chat_template.ChatTemplateError,
                                "message 0 has a part"):
      self.encoder.encode([{"role": "user", "content": [{"type": "audio"}]},
                           self.messages[1]])


if __name__ == "__main__":
  absltest.main()
