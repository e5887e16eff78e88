#!/usr/bin/env python3
"""test_chat_to_jsonl: scripts/chat_to_jsonl.py's loss masks, with stand-in tokenizers.

StandIn renders ChatML as Qwen3's template does in the ways that matter here (each message
stripped, an empty reasoning block before the last assistant reply only, so the history of a
rendering is not the rendering of the history), the markers as single tokens, every other
character one token, with offsets. Qwen3 is Qwen3's own template ported to Python (nothing
stripped, reasoning split out of replies, dropped before the last user turn); Words is that with
word and byte tokens. Each records where it wrote each reply (the oracle). Checks: the masked
characters are exactly each reply and its <|im_end|> (not the reasoning block, not a user message
that contains the reply's text, not the newline after the marker), also for replies whose text
occurs in the markup ("a", "end", "assistant", "<think>": the audit of 2026-12-04) and in
earlier turns; Qwen3's reasoning kept in the last reply and a reply it rewrites skipped; empty,
whitespace and unicode replies; tokens straddling a reply's edge; ShareGPT and OpenAI styles and
a JSON array; the skipped lines and their reasons; --max-len truncation, a negative one refused;
the output written atomically and not at all when nothing is kept. Needs no transformers (real
tokenizers are checked on the GPU machine by tests/reference/chat_to_jsonl_hf.py)."""
import io
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import chat_to_jsonl as c2j  # noqa: E402

SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
EOT = "<|im_end|>"
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
        out, self.wrote = "", []  # wrote: where each assistant reply's text went (the oracle)
        for i, m in enumerate(msgs):
            body = m["content"].strip()
            out += f"<|im_start|>{m['role']}\n" + ("<think>\n\n</think>\n\n" if i == last else "")
            if m["role"] == "assistant":
                self.wrote.append((m["content"], len(out), len(out) + len(body)))
            out += f"{body}<|im_end|>\n"
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


class Qwen3(StandIn):
    """Qwen3's own chat template (tokenizer_config.json of Qwen3-8B, the path without tools) in
    Python: nothing stripped; the replies after the last user turn get a <think> block (empty
    when they carry no reasoning), the last one always; a reply's "<think>R</think>A" is split
    into reasoning R and content A, and the reasoning of replies before the last user turn is
    dropped; a user turn that is a <tool_response> does not count as the last user turn."""

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False,
                            enable_thinking=None, **kw):
        assert not tokenize
        out, self.wrote = "", []
        if msgs[0]["role"] == "system":
            out += "<|im_start|>system\n" + msgs[0]["content"] + "<|im_end|>\n"
        last_query = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] == "user"
                           and not (msgs[i]["content"].startswith("<tool_response>") and
                                    msgs[i]["content"].endswith("</tool_response>"))),
                          len(msgs) - 1)
        for i, m in enumerate(msgs):
            content = m["content"]
            if m["role"] == "user" or (m["role"] == "system" and i > 0):
                out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
            elif m["role"] == "assistant":
                reasoning = ""
                if "</think>" in content:
                    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1]
                    reasoning = reasoning.lstrip("\n")
                    content = content.split("</think>")[-1].lstrip("\n")
                out += "<|im_start|>assistant\n"
                if i > last_query and (i == len(msgs) - 1 or reasoning):
                    out += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                    content = content.lstrip("\n")
                self.wrote.append((m["content"], len(out), len(out) + len(content)))
                out += content + "<|im_end|>\n"
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
            if enable_thinking is False:
                out += "<think>\n\n</think>\n\n"
        return out


class Words(Qwen3):
    """Qwen3's template with tokens closer to a byte-level BPE's: a run of whitespace and the word
    after it is one token (so "\\nyes" straddles the edge between a header and its reply), each
    UTF-8 byte of a non-ASCII character one token with that character's offsets."""

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids, offs, i = [], [], 0
        while i < len(text):
            sp = next((s for s in SPECIAL if text.startswith(s, i)), None)
            if sp:
                ids.append(SPECIAL.index(sp) + 1)
                offs.append((i, i + len(sp)))
                i += len(sp)
            elif ord(text[i]) > 127:
                for b in text[i].encode():
                    ids.append(300 + b)
                    offs.append((i, i + 1))
                i += 1
            else:
                j = i
                while j < len(text) and text[j].isspace():
                    j += 1
                while (j < len(text) and not text[j].isspace() and ord(text[j]) < 128 and
                       not any(text.startswith(s, j) for s in SPECIAL)):
                    j += 1
                ids.append(10 + ord(text[i]))
                offs.append((i, j))
                i = j
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

def chat(*turns, system=None):
    """A conversation of alternating user / assistant turns (OpenAI style)."""
    msgs = [{"role": "system", "content": system}] if system is not None else []
    return {"messages": msgs + [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                                for i, t in enumerate(turns)]}


def masked_chars(tok, obj):
    """(text, set of the character positions the mask covers, the masked characters in order)."""
    eot = c2j.end_of_turn(tok, {})
    ids, mask = c2j.convert(tok, obj, eot, {}, 0)
    text = tok.apply_chat_template(c2j.normalize(obj))  # last: tok.wrote is this rendering's
    offs = tok(text)["offset_mapping"]
    covered = {p for (a, b), m in zip(offs, mask) if m for p in range(a, b)}
    return text, covered, "".join(text[p] for p in sorted(covered))


def check_replies(tok, obj, what, said=None):
    """The mask covers exactly what the template wrote for each non-empty reply and the <|im_end|>
    right after it (tok.wrote is the oracle); said: what that text must be, when given."""
    text, covered, got = masked_chars(tok, obj)
    want = {p for _, a, b in tok.wrote if text[a:b].strip() for p in range(a, b + len(EOT))}
    wrote = "".join(text[a:b] + EOT for _, a, b in tok.wrote if text[a:b].strip())
    check(covered == want and got == (wrote if said is None else said),
          f"{what}: masked {got!r}, want {wrote if said is None else said!r}")


def check_skipped(tok, obj, what):
    try:
        c2j.convert(tok, obj, c2j.end_of_turn(tok, {}), {}, 0)
        check(False, f"{what}: skipped")
    except c2j.Skip as e:
        check("does not render this reply as given" in str(e), f"{what}: reason {e}")


# a reply whose text also occurs in the template's markup is found where the template wrote it,
# not in the markup (it used to be found by searching the rendering: "a" masked <|im_start|>,
# "end" the user turn's <|im_end|>, "assistant" the header's role, "<think>" the reasoning block's)
audit = [chat("pick one: a or b?", "a"), chat("Do we start or end?", "end"),
         chat("Who is speaking?", "assistant"), chat("How does reasoning open?", "<think>"),
         chat("Which marker ends a turn?", "<|im_end|>"),
         chat("start or end?", "start", "Repeat my question.", "start or end?",
              "And its last word?", "end", system="Answer in one word. start"),
         chat("say: think", "think", "say: s", "s", "say: user", "user")]
for t in (StandIn(), Qwen3()):
    for obj in audit:
        replies = [m["content"] for m in obj["messages"] if m["role"] == "assistant"]
        check_replies(t, obj, f"{type(t).__name__} {replies!r}",
                      said="".join(r + "<|im_end|>" for r in replies))

# Qwen3's own template: nothing stripped, an empty reply masks nothing, reasoning written as the
# template writes it stays in the last reply, reasoning the template drops or moves skips the line
q3 = Qwen3()
check_replies(q3, chat("hi?", " hi ", "again?", "\n\nhi\n"), "Qwen3 whitespace as rendered",
              said=" hi <|im_end|>hi\n<|im_end|>")
check_replies(q3, chat("q", "", "q2", "  ", "q3", "a"), "Qwen3 empty replies", said="a<|im_end|>")
check_replies(q3, chat("¿qué?", "日本語です。", "and?", "e\u0301t\u00e9 😀"), "Qwen3 unicode",
              said="日本語です。<|im_end|>e\u0301t\u00e9 😀<|im_end|>")
_, _, got = masked_chars(q3, chat("why?", "<think>\nbecause\n</think>\n\nyes"))
check(got == "<think>\nbecause\n</think>\n\nyes<|im_end|>", f"Qwen3 reasoning: {got!r}")
check_skipped(q3, chat("why?", "<think>\nbecause\n</think>\n\nyes", "ok?", "ok"),
              "Qwen3 drops an earlier reply's reasoning")
check_skipped(q3, chat("why?", "<think>because</think>yes"), "Qwen3 reformats the reasoning")
check_skipped(q3, chat("close it", "</think>"), "Qwen3 renders '</think>' as no reply")

# token boundaries: a token that straddles a reply's edge ("\na" after the header, "\n\nyes"
# after the reasoning block) is masked, multi-byte characters split into byte tokens are masked
# whole, a token that overlaps no reply and no marker is not
w = Words()
for obj in (chat("a or b?", "a", "more?", "  spaced out  ", "and?", "日本 😀 ok"),
            chat("yes?", "😀", "sure?", "yes")):
    text, covered, got = masked_chars(w, obj)
    want = {p for _, a, b in w.wrote for p in range(a, b + len(EOT))}
    offs = w(text)["offset_mapping"]
    check(any(a not in want and set(range(a, b)) & want for a, b in offs),
          f"Words: a token straddles a header and a reply in {text!r}")
    check(want <= covered and all(set(range(a, b)) & want for a, b in offs
                                  if set(range(a, b)) & covered), f"Words: masked {got!r}")

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

# a whole file: skipped lines with reasons and their tally, JSON array input, atomic output
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
    check((written, sum(skipped.values())) == (2, 3), f"2 written, 3 skipped: {written}, {skipped}")
    reasons = log.getvalue().splitlines()
    for n, why in ((2, "not JSON"), (3, "unknown role 'tool'"), (4, "no assistant reply")):
        said = [r for r in reasons if r.startswith(f"{src}:{n}: skipped: ")]
        check(len(said) == 1 and why in said[0], f"line {n}: {why}")
    check(reasons[-1].startswith(f"{dst}: 2 conversations, {tokens} tokens ({trained} trained, ")
          and reasons[-1].endswith(", 3 skipped (not JSON: 1, unknown role: 1, "
                                   "no assistant reply: 1)"), f"summary: {reasons[-1]}")
    with open(dst) as f:
        out = [json.loads(x) for x in f]
    check(len(out) == 2 and all(set(o) == {"input_ids", "loss_mask"} for o in out),
          "output lines are {input_ids, loss_mask}")
    check(tokens == sum(len(o["input_ids"]) for o in out) and
          trained == sum(sum(o["loss_mask"]) for o in out), "counts match the output")
    check(not [n for n in os.listdir(d) if n.startswith("out.jsonl.tmp")], "no temp file left")

    # a conversion killed outright left its temporary file: the next one removes it (a live
    # process's is kept)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale, live = f"{dst}.tmp.{gone.pid}", f"{dst}.tmp.{os.getppid()}"
    for path in (stale, live):
        with open(path, "w") as f:
            f.write("part")
    log = io.StringIO()
    c2j.run(tok, src, dst, {}, 0, log=log)
    check(not os.path.exists(stale) and os.path.exists(live) and
          f"removed {stale}: a partial conversion left by process {gone.pid}" in log.getvalue(),
          f"a dead conversion's temporary file removed, a live one's kept: {log.getvalue()}")
    os.unlink(live)

    with open(src, "w") as f:
        json.dump([openai, sharegpt], f)
    log = io.StringIO()
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=log)
    check((written, skipped) == (2, {}) and log.getvalue().endswith(", 0 skipped\n"),
          f"a JSON array of conversations: {log.getvalue()}")

    # replies Qwen3's template rewrites: each line reported, and tallied in the summary
    with open(src, "w") as f:
        for obj in (chat("pick one: a or b?", "a"), chat("why?", "<think>R</think>A", "ok?", "ok"),
                    chat("close it", "</think>")):
            f.write(json.dumps(obj) + "\n")
    log = io.StringIO()
    written, skipped, _, _ = c2j.run(Qwen3(), src, dst, {}, 0, log=log)
    said = log.getvalue().splitlines()
    check(written == 1 and skipped == {"reply rewritten by the template": 2} and
          [r.split(": skipped: ")[0] for r in said[:-1]] == [f"{src}:2", f"{src}:3"] and
          said[-1].endswith(", 2 skipped (reply rewritten by the template: 2)"),
          f"rewritten replies reported and tallied: {said}")
    log = io.StringIO()
    c2j.run(Qwen3(), src, dst, {}, 0, log=log, max_reports=1)
    said = log.getvalue().splitlines()
    check(len(said) == 2 and said[-1].endswith(
        ", 2 skipped (reply rewritten by the template: 2; the first 1 reported above)"),
        f"reports past max_reports are only tallied: {said}")

    os.unlink(dst)
    with open(src, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=io.StringIO())
    check(written == 0 and not os.path.exists(dst) and not os.path.exists(dst + ".tmp"),
          "nothing kept: no output file")

def usage_error(args, what):
    """main(--tokenizer none + args) must refuse them as a usage error (exit 2) naming `what`,
    before any tokenizer is loaded."""
    err = io.StringIO()
    stderr, sys.stderr = sys.stderr, err
    try:
        c2j.main(["--tokenizer", "none"] + args)
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception as e:  # noqa: BLE001 (got past the checks: the tokenizer's load failed)
        code = repr(e)
    finally:
        sys.stderr = stderr
    check(code == 2 and what in err.getvalue(), f"refused, exit 2, {what!r}: {code!r} "
          f"{err.getvalue()!r}")


# inputs as exports write them: a raw U+2028 inside a reply (JSON allows it; splitlines() cut the
# line there), a byte-order mark before JSONL and before a JSON array, a line that is not UTF-8
# (skipped with its line number; it stopped the whole run with a traceback), and a file of bare
# message lists, which starts with "[" and is no JSON array (said, no traceback)
with tempfile.TemporaryDirectory() as d:
    src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
    sep = chat("first\u2028second?", "one\u2028two")
    with open(src, "wb") as f:
        f.write(c2j.BOM + json.dumps(sep, ensure_ascii=False).encode() + b"\n" +
                b'{"messages": "\xff"}\n' + json.dumps(openai).encode() + b"\r\n")
    log = io.StringIO()
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=log)
    said = log.getvalue().splitlines()
    check(written == 2 and skipped == {"not UTF-8": 1} and said[0].startswith(f"{src}:2: skipped: "
          "not UTF-8"), f"BOM, raw U+2028, a line not UTF-8, CRLF: {said}")
    with open(dst) as f:
        first = json.loads(f.readline())
    check(first == dict(zip(("input_ids", "loss_mask"), c2j.convert(tok, sep, c2j.end_of_turn(
        tok, {}), {}, 0))), "the U+2028 conversation converted whole")
    with open(src, "wb") as f:
        f.write(c2j.BOM + json.dumps([openai, sharegpt]).encode())
    written, skipped, _, _ = c2j.run(tok, src, dst, {}, 0, log=io.StringIO())
    check((written, skipped) == (2, {}), "a JSON array after a byte-order mark")
    with open(src, "w") as f:
        f.write(json.dumps(openai["messages"]) + "\n" + json.dumps(openai["messages"]) + "\n")
    try:
        c2j.run(tok, src, dst, {}, 0, log=io.StringIO())
        check(False, "a file of bare message lists is refused")
    except c2j.InputError as e:
        check("is not one JSON array" in str(e) and "per line" in str(e), f"said: {e}")

    # a pipe (--in <(zcat chats.jsonl.gz)) is read too: looked at, never seeked
    for data, want in ((json.dumps(openai).encode() + b"\n", [openai]),
                       (c2j.BOM + json.dumps([openai, sharegpt]).encode(), [openai, sharegpt])):
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        got = [obj for _, obj in c2j.read_objects(f"/dev/fd/{r}")]
        os.close(r)
        check(got == want, f"read from a pipe: {got}")

    # the files checked before any tokenizer is loaded (usage errors, exit 2)
    usage_error(["--in", src, "--out", src], "is --in")
    usage_error(["--in", src, "--out", os.path.join(d, ".", "in.jsonl")], "is --in")
    usage_error(["--in", src, "--out", os.path.join(d, "no", "out.jsonl")], "does not exist")
    usage_error(["--in", os.path.join(d, "none.jsonl"), "--out", dst], "no readable file")
    with open(src) as f:
        check(f.read().startswith("[{"), "--in left as it was")

# a negative --max-len is refused (usage error, exit 2) before any tokenizer is loaded: it used
# to cut that many tokens off the end of every conversation (ids[:-5])
usage_error(["--in", src, "--out", dst, "--max-len", "-5"], "--max-len")

print("ok" if not failed else f"{failed} failed")
sys.exit(1 if failed else 0)
