#!/usr/bin/env python3
"""test_chat_to_jsonl: scripts/chat_to_jsonl.py's loss masks, with a stand-in tokenizer.

The stand-in renders ChatML as Qwen3's template does in the ways that matter here: each message
stripped, an empty reasoning block before the last assistant reply only (so the history of a
rendering is not the rendering of the history), the markers as single tokens, every other
character one token, with offsets. Checks: the masked characters are exactly each reply and its
<|im_end|> (not the reasoning block, not a user message that contains the reply's text, not the
newline after the marker); ShareGPT and OpenAI styles and a JSON array; the skipped lines and
their reasons; --max-len truncation, a negative one refused; a straddling token; the output written atomically and not
at all when nothing is kept. Needs no transformers (the real tokenizer is checked on the GPU
machine by tests/reference/chat_to_jsonl_hf.py)."""
import io
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import chat_to_jsonl as c2j  # noqa: E402

SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
        print("FAIL:", what)


class StandIn:
    """apply_chat_template and __call__ (with offsets) of a ChatML fast tokenizer."""

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False, **kw):
        assert not tokenize
        last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        out = ""
        for i, m in enumerate(msgs):
            body = m["content"].strip()
            if i == last:
                body = "<think>\n\n</think>\n\n" + body
            out += f"<|im_start|>{m['role']}\n{body}<|im_end|>\n"
        return out

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids, offs, i = [], [], 0
        while i < len(text):
            sp = next((s for s in SPECIAL if text.startswith(s, i)), None)
            n = len(sp) if sp else 1
            ids.append(SPECIAL.index(sp) + 1 if sp else 10 + ord(text[i]))
            offs.append((i, i + n))
            i += n
        return {"input_ids": ids, "offset_mapping": offs}


def masked_text(tok, obj, max_len=0):
    eot = c2j.end_of_turn(tok, {})
    ids, mask = c2j.convert(tok, obj, eot, {}, max_len)
    text = tok.apply_chat_template(c2j.normalize(obj))
    offs = tok(text)["offset_mapping"][:len(ids)]
    return "".join(text[a:b] for (a, b), m in zip(offs, mask) if m), ids, mask


tok = StandIn()
check(c2j.end_of_turn(tok, {}) == "<|im_end|>", "end of turn is <|im_end|>")

sharegpt = {"conversations": [
    {"from": "system", "value": "Be brief."},
    {"from": "human", "value": "say hi there"},
    {"from": "gpt", "value": " hi "},
    {"from": "human", "value": "Sure thing. again"},
    {"from": "gpt", "value": "Sure thing."}]}
got, ids, mask = masked_text(tok, sharegpt)
check(got == "hi<|im_end|>Sure thing.<|im_end|>", f"ShareGPT replies masked: {got!r}")
check(len(ids) == len(mask), "one mask value per token")

openai = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                       {"role": "user", "content": "and 3+3?"},
                       {"role": "assistant", "content": "6"}]}
got, _, _ = masked_text(tok, openai)
check(got == "4<|im_end|>6<|im_end|>", f"OpenAI replies masked: {got!r}")

# truncation: the first reply survives a cut inside the second; a cut before it skips the line
text = tok.apply_chat_template(c2j.normalize(openai))
first_end = text.index("4<|im_end|>")
got, ids, _ = masked_text(tok, openai, max_len=first_end + 2)
check(len(ids) == first_end + 2 and got == "4<|im_end|>", f"truncated: {got!r}")
try:
    c2j.convert(tok, openai, "<|im_end|>", {}, 5)
    check(False, "a cut before every reply is skipped")
except c2j.Skip as e:
    check("no assistant token" in str(e), f"reason of a cut before every reply: {e}")

# a token straddling a span's edge counts, a zero-width one does not
check(c2j.mask_tokens([(0, 2), (2, 4), (4, 4), (4, 6), (6, 9)], [(3, 4), (7, 8)]) ==
      [0, 1, 0, 0, 1], "straddling and empty tokens")

# a whole file: skipped lines with reasons, JSON array input, atomic output
with tempfile.TemporaryDirectory() as d:
    src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
    lines = [json.dumps(sharegpt), "{not json", json.dumps({"messages": [
        {"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}),
        json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
        "", json.dumps(openai)]
    with open(src, "w") as f:
        f.write("\n".join(lines) + "\n")
    log = io.StringIO()
    written, skipped, tokens, trained = c2j.run(tok, src, dst, {}, 0, log=log)
    check((written, skipped) == (2, 3), f"2 written, 3 skipped: {written}, {skipped}")
    reasons = log.getvalue().splitlines()
    for n, why in ((2, "not JSON"), (3, "unknown role 'tool'"), (4, "no assistant reply")):
        said = [r for r in reasons if r.startswith(f"{src}:{n}: skipped: ")]
        check(len(said) == 1 and why in said[0], f"line {n}: {why}")
    with open(dst) as f:
        out = [json.loads(x) for x in f]
    check(len(out) == 2 and all(set(o) == {"input_ids", "loss_mask"} for o in out),
          "output lines are {input_ids, loss_mask}")
    check(tokens == sum(len(o["input_ids"]) for o in out) and
          trained == sum(sum(o["loss_mask"]) for o in out), "counts match the output")
    check(not os.path.exists(dst + ".tmp"), "no temp file left")

    with open(src, "w") as f:
        json.dump([openai, sharegpt], f)
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=io.StringIO())
    check((written, skipped) == (2, 0), "a JSON array of conversations")

    os.unlink(dst)
    with open(src, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=io.StringIO())
    check(written == 0 and not os.path.exists(dst) and not os.path.exists(dst + ".tmp"),
          "nothing kept: no output file")

# a negative --max-len is refused (usage error, exit 2) before any tokenizer is loaded: it used
# to cut that many tokens off the end of every conversation (ids[:-5])
err = io.StringIO()
stderr, sys.stderr = sys.stderr, err
try:
    c2j.main(["--tokenizer", "none", "--in", src, "--out", dst, "--max-len", "-5"])
    code = 0
except SystemExit as e:
    code = e.code
except Exception as e:  # noqa: BLE001 (got past the options: the tokenizer's load failed)
    code = repr(e)
finally:
    sys.stderr = stderr
check(code == 2 and "--max-len" in err.getvalue(), f"--max-len -5 refused, exit 2: {code!r}")

print("ok" if not failed else f"{failed} failed")
sys.exit(1 if failed else 0)
