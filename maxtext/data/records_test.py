"""Tests for maxtext.data.records: documents and the reasons records are bad."""

import json

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.data import assets
from maxtext.data import chat_template
from maxtext.data import records
from maxtext.data import tokenizer as tokenizer_lib


class RecordsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.default_tokenizer())
    self.encoder = records.DocumentEncoder(
        self.tok, text_field="text", max_document_bytes=64, add_bos=True,
        add_eos=True)

  def test_record_ids_round_trip(self):
    rid = records.record_id(3, 123_456_789)
    self.assertEqual(records.split_record_id(rid), (3, 123_456_789))

  @parameterized.parameters("text", "json", "value")
  def test_document_is_bos_text_eos(self, payload):
    text = "Now is the winter of our discontent"
    raw = {"text": text.encode(), "json": json.dumps({"text": text}).encode(),
           "value": text}[payload]
    document = self.encoder.encode(raw, payload, rid=7)
    expected = [self.tok.bos_id] + self.tok.encode(text) + [self.tok.eos_id]
    np.testing.assert_array_equal(document["tokens"], expected)
    np.testing.assert_array_equal(document["weights"], 1)
    np.testing.assert_array_equal(document["record_ids"], 7)
    self.assertEqual(document["tokens"].dtype, np.int32)

  def test_bos_and_eos_are_optional(self):
    encoder = records.DocumentEncoder(
        self.tok, text_field="text", max_document_bytes=64, add_bos=False,
        add_eos=True)
    document = encoder.encode(b"Hello", "text", rid=0)
    self.assertEqual(document["tokens"].tolist(),
                     self.tok.encode("Hello") + [self.tok.eos_id])

  @parameterized.named_parameters(
      ("invalid_json", b'{"text": "unterminated', "json",
       "invalid JSON: Unterminated string"),
      ("not_an_object", b'["text"]', "json", "a JSON list, expected an object"),
      ("missing_field", b'{"body": "x"}', "json", "no field 'text'.*'body'"),
      ("wrong_type", b'{"text": 42}', "json", "field 'text' is int, expected"),
      ("null_value", None, "value", "field 'text' is null"),
      ("empty_text", b'{"text": "  \\n"}', "json", "empty text"),
      ("non_utf8", b"caf\xe9", "text", "not valid UTF-8.*at byte 3"),
      ("too_large", b"x" * 65, "text",
       "65 bytes, more than data.max_document_bytes=64"),
  )
  def test_bad_record_reasons(self, raw, payload, reason):
    bad = self.encoder.encode(raw, payload, rid=5)
    self.assertIsInstance(bad, records.BadRecord)
    self.assertEqual(bad.record_id, 5)
    self.assertRegex(bad.reason, reason)

  def test_json_nested_too_deeply_is_a_bad_record(self):
    encoder = records.DocumentEncoder(
        self.tok, text_field="text", max_document_bytes=1 << 16,
        add_bos=True, add_eos=True)
    raw = b'{"text": "x", "deep": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    bad = encoder.encode(raw, "json", rid=3)
    self.assertIsInstance(bad, records.BadRecord)
    self.assertEqual(bad.reason, "invalid JSON: nested too deeply")

  def test_chat_records_weight_assistant_turns(self):
    encoder = records.DocumentEncoder(
        self.tok, text_field="messages", max_document_bytes=1 << 16,
        add_bos=True, add_eos=True,
        chat=chat_template.ChatEncoder(chat_template.TEMPLATES["mistral"],
                                       self.tok))
    messages = [{"role": "user", "content": "Who goes there?"},
                {"role": "assistant", "content": "A friend."}]
    document = encoder.encode(json.dumps({"messages": messages}).encode(),
                              "json", rid=1)
    tokens, weights = document["tokens"], document["weights"]
    # The template brings BOS; the encoder adds none of its own.
    self.assertEqual(tokens[0], self.tok.bos_id)
    self.assertNotEqual(tokens[1], self.tok.bos_id)
    self.assertEqual(tokens[-1], self.tok.eos_id)
    self.assertEqual(self.tok.decode(tokens[weights == 1].tolist()),
                     "A friend.")
    bad = encoder.encode(b'{"messages": "hi"}', "json", rid=2)
    self.assertRegex(bad.reason, "list of messages")


if __name__ == "__main__":
  absltest.main()
