#!/usr/bin/env python3
"""chat_to_jsonl_hf: scripts/chat_to_jsonl.py with real Hugging Face tokenizers (transformers and
tokenizers installed; no download: the tokenizers are trained here on a few sentences).

Two templates in the styles of the families the target supports: ChatML as Qwen's (markers
<|im_start|> / <|im_end|>) and Llama 3's (header markers, each message trimmed, <|eot_id|>, a
BOS the template writes). For each: the script runs as a user would (its command line, on a
saved tokenizer directory), and the tokens its loss masks select, decoded, must be exactly each
assistant reply followed by the end-of-turn marker; dflash-data (--build, optional) must then
take the output. Prints "ok" per template; exit 1 on any mismatch.

    python3 tests/reference/chat_to_jsonl_hf.py [--build BUILD_DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
          "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
CASES = [("chatml", CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
         ("llama3", LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], "<|eot_id|>")]
CORPUS = ["the quick brown fox jumps over the lazy dog", "what is two plus two? it is four",
          "please say hello to the user", "sure, here is a short answer", "system: be brief"] * 20
CHATS = [
    {"messages": [{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "please say hello"},
                  {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "what is two plus two? say hello first"},
                  {"role": "assistant", "content": " hello, it is four "}]},
    {"conversations": [{"from": "human", "value": "the quick brown fox?"},
                       {"from": "gpt", "value": "jumps over the lazy dog"}]},
    # replies whose text also occurs in the markup (they used to be found there)
    {"messages": [{"role": "user", "content": "pick one: a or b?"},
                  {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": "Do we start or end?"},
                  {"role": "assistant", "content": "end"},
                  {"role": "user", "content": "who is speaking?"},
                  {"role": "assistant", "content": "assistant"},
                  {"role": "user", "content": "and the header says?"},
                  {"role": "assistant", "content": "start_header_id"}]},
]


def make_tokenizer(d, template, specials):
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>"] + specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = specials[0] if specials[0] == "<|begin_of_text|>" else None
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, unk_token="<unk>",
                                 additional_special_tokens=specials)
    hf.chat_template = template
    hf.save_pretrained(d)
    return hf


def expected(chat, eot):
    turns = chat.get("messages") or chat["conversations"]
    return "".join((t.get("content") or t.get("value")).strip() + eot for t in turns
                   if t.get("role", t.get("from")) in ("assistant", "gpt"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="")
    a = ap.parse_args()
    failed = 0
    for name, template, specials, eot in CASES:
        with tempfile.TemporaryDirectory() as d:
            tok = make_tokenizer(os.path.join(d, "tok"), template, specials)
            src, dst = os.path.join(d, "chats.jsonl"), os.path.join(d, "train.jsonl")
            with open(src, "w") as f:
                f.write("".join(json.dumps(c) + "\n" for c in CHATS))
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "chat_to_jsonl.py"),
                            "--tokenizer", os.path.join(d, "tok"), "--in", src, "--out", dst],
                           check=True)
            with open(dst) as f:
                rows = [json.loads(x) for x in f]
            ok = len(rows) == len(CHATS)
            for chat, row in zip(CHATS, rows):
                ids = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m]
                got = tok.decode(ids, skip_special_tokens=False)
                want = expected(chat, eot)
                if got != want:
                    print(f"{name}: masked tokens decode to {got!r}, want {want!r}")
                    ok = False
            if ok and a.build:
                r = subprocess.run([os.path.join(a.build, "tools", "dflash-data"), "--in", dst,
                                    "--out", os.path.join(d, "train.shard"), "--vocab",
                                    str(len(tok)), "--strict"], capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"{name}: dflash-data refused the output: {r.stderr.strip()}")
                    ok = False
            print(("ok: " if ok else "FAIL: ") + name)
            failed += not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
