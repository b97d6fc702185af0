"""Arithmetic word problems with exact numeric answers, generated
deterministically: the bundled RL task of `configs/grpo.py:smollm2_arithmetic`
and its held-out set, scored by `eval --tasks=maxtext_word_problems`.

`problems(split, count, seed)` draws problems from templates (a name, an
item, numbers); each record is {"prompt", "answer", "question"}: the
question, the prompt (a worked example, the question, and the request for
the final answer as "#### N", what `rewards.first_answer` reads), and the
answer as a string. Splits: "easy"
(one addition or subtraction of numbers up to 20) and "standard"
(additions and subtractions up to 100, products up to 12 x 12, and
two-step problems). `write_split(folder, split)` writes a split's train
and held-out sets (`BUNDLED` sizes), which never share a question; the
standard held-out set is also the eval task's data
(maxtext/eval/tasks/maxtext_word_problems), the easy one that of
maxtext_word_problems_easy.
"""

import json
import os
import random

SPLITS = ("easy", "standard")
# (split, train count, held-out count): the bundled files.
BUNDLED = (("easy", 400, 200), ("standard", 2000, 200))
# A worked example, then the question: small instruct models follow it and
# put the answer after "####" (the first "####" is what counts).
EXAMPLE = ("Example:\nQuestion: Tom has 3 pens. Tom gets 4 more pens. How many"
           " pens does Tom have now?\nAnswer: Tom has 3 + 4 = 7 pens.\n#### 7")
INSTRUCTION = ("Answer with one short line of working, then the final answer"
               " as \"#### <number>\".")
_NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo",
          "Iris", "Jonas", "Kira", "Liam", "Maya", "Noah", "Olga", "Pablo")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils",
          "cookies", "stamps", "shells", "cards")


def _add(rng: random.Random, top: int) -> tuple[str, int]:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  a, b = rng.randint(1, top), rng.randint(1, top)
  return (f"{name} has {a} {item}. {name} gets {b} more {item}. How many"
          f" {item} does {name} have now?", a + b)


def _subtract(rng: random.Random, top: int) -> tuple[str, int]:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  a = rng.randint(2, top)
  b = rng.randint(1, a - 1)
  return (f"{name} had {a} {item} and gave {b} of them away. How many"
          f" {item} does {name} have left?", a - b)


def _multiply(rng: random.Random, top: int) -> tuple[str, int]:
  del top
  item = rng.choice(_ITEMS)
  a, b = rng.randint(2, 12), rng.randint(2, 12)
  return (f"There are {a} boxes with {b} {item} in each box. How many {item}"
          f" are there in all?", a * b)


def _two_step(rng: random.Random, top: int) -> tuple[str, int]:
  del top
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  packs, each = rng.randint(2, 9), rng.randint(2, 9)
  used = rng.randint(1, packs * each - 1)
  return (f"{name} buys {packs} packs of {item} with {each} {item} in each"
          f" pack, then gives away {used} {item}. How many {item} does"
          f" {name} have now?", packs * each - used)


_TEMPLATES = {"easy": ((_add, 20), (_subtract, 20)),
              "standard": ((_add, 100), (_subtract, 100), (_multiply, 0),
                           (_two_step, 0))}


def prompt(question: str) -> str:
  """The prompt of `question`: the worked example, the question and the
  instruction."""
  return f"{EXAMPLE}\n\nQuestion: {question}\n{INSTRUCTION}"


def problems(split: str, count: int, seed: int = 0) -> list[dict[str, str]]:
  """`count` distinct problems of `split` (see the module docstring).

  Raises:
    ValueError: `split` is not one of `SPLITS`, or the templates cannot
      make `count` distinct problems.
  """
  if split not in _TEMPLATES:
    raise ValueError(f"split={split!r} is invalid; valid: {SPLITS}.")
  rng = random.Random(f"{split}-{seed}")
  seen, records = set(), []
  for _ in range(100 * count):
    if len(records) == count:
      break
    template, top = rng.choice(_TEMPLATES[split])
    question, answer = template(rng, top)
    if question in seen:
      continue
    seen.add(question)
    records.append({"prompt": prompt(question), "answer": str(answer),
                    "question": question})
  if len(records) < count:
    raise ValueError(f"The {split} templates made {len(records)} distinct"
                     f" problems, fewer than {count}.")
  return records


def write_split(folder: str, split: str) -> tuple[str, str]:
  """Writes `split`'s bundled train and held-out sets (`BUNDLED`) to
  `folder` as {split}_train.jsonl and {split}_heldout.jsonl; returns their
  paths."""
  train, heldout = next((t, h) for s, t, h in BUNDLED if s == split)
  records = problems(split, train + heldout)
  paths = []
  for name, part in (("train", records[:train]),
                     ("heldout", records[train:])):
    path = os.path.join(folder, f"{split}_{name}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      for record in part:
        f.write(json.dumps(record) + "\n")
    paths.append(path)
  return paths[0], paths[1]
