#!/usr/bin/env python3
"""chat_to_jsonl: chat conversations to the tokenized JSONL that dflash-data reads.

    scripts/chat_to_jsonl.py --tokenizer /models/Qwen3-8B --in chats.jsonl --out train.jsonl

Input: JSONL, one conversation per line, or one JSON array of them; each is an object with
"messages" ([{"role", "content"}], OpenAI style) or "conversations" (ShareGPT style, "from" /
"value" or "role" / "content"; human -> user, gpt -> assistant). Output: one line per
conversation, {"input_ids": [...], "loss_mask": [...]}, the conversation rendered by the
tokenizer's own chat template (Hugging Face transformers, a fast tokenizer) and tokenized; the
loss mask is 1 on the tokens of each assistant reply and the end-of-turn marker after it (what
the target generates; the DFlash recipe trains only there), 0 on everything else (system and
user turns, the template's markup, the generation prompt).

How the replies are found: the template may rewrite a conversation's history (Qwen3's drops
reasoning from earlier turns, Llama 3's trims each message), so rendering prefixes of the
conversation need not give prefixes of its rendering. Instead every message's text (stripped)
is looked up in the full rendering in order, each search starting where the last match ended,
so a reply that repeats an earlier user message is not mistaken for it. The end-of-turn marker
is learnt once from a probe conversation. A conversation whose messages cannot all be found,
with an unknown role, or with no assistant text is skipped with its line number and the reason.
Needs transformers only when run (the span logic is tested in CI with a stand-in tokenizer:
tests/unit/test_chat_to_jsonl.py).
"""
import argparse
import json
import os
import sys

ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "model": "assistant", "chatgpt": "assistant", "system": "system"}
PROBE_USER, PROBE_REPLY = "probe question 1729", "probe reply 4104"


class Skip(Exception):
    """A conversation that cannot be converted: the reason, for the FILE:LINE report."""


def normalize(obj):
    """The conversation of one input object as [{"role", "content"}] with known roles."""
    if not isinstance(obj, dict):
        raise Skip("not a JSON object")
    turns = obj.get("messages", obj.get("conversations"))
    if not isinstance(turns, list) or not turns:
        raise Skip('no "messages" or "conversations" list')
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise Skip(f"message {i} is not an object")
        role = t.get("role", t.get("from"))
        text = t.get("content", t.get("value"))
        if not isinstance(role, str) or role.lower() not in ROLES:
            raise Skip(f"message {i}: unknown role {role!r} (known: {', '.join(sorted(ROLES))})")
        if not isinstance(text, str):
            raise Skip(f"message {i}: content is not a string")
        out.append({"role": ROLES[role.lower()], "content": text})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in out):
        raise Skip("no assistant reply")
    return out


def end_of_turn(tok, template_kwargs):
    """What the template writes after an assistant reply (e.g. "<|im_end|>"), or "" if nothing."""
    msgs = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": PROBE_REPLY}]
    text = tok.apply_chat_template(msgs, tokenize=False, **template_kwargs)
    at = text.rfind(PROBE_REPLY)
    if at < 0:
        raise SystemExit("chat_to_jsonl: the chat template drops the assistant's reply from a "
                         "probe conversation: cannot find replies in renderings")
    return text[at + len(PROBE_REPLY):].strip()


def reply_spans(text, msgs, eot):
    """[start, end) character ranges of each assistant reply (plus eot when it follows) in text,
    the rendering of msgs."""
    spans, pos = [], 0
    for i, m in enumerate(msgs):
        body = m["content"].strip()
        if not body:
            continue
        at = text.find(body, pos)
        if at < 0:
            raise Skip(f"message {i} ({m['role']}) is not in the template's rendering")
        end = at + len(body)
        if m["role"] == "assistant":
            if eot and text.startswith(eot, end):
                end += len(eot)
            spans.append((at, end))
        pos = end
    return spans


def mask_tokens(offsets, spans):
    """1 for each token (offset pair) that overlaps a span, else 0; spans are sorted."""
    mask, k = [], 0
    for start, end in offsets:
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        inside = k < len(spans) and start < spans[k][1] and end > spans[k][0] and end > start
        mask.append(1 if inside else 0)
    return mask


def convert(tok, obj, eot, template_kwargs, max_len):
    """(input_ids, loss_mask) of one input object; raises Skip."""
    msgs = normalize(obj)
    try:
        text = tok.apply_chat_template(msgs, tokenize=False, **template_kwargs)
    except Exception as e:  # the template's own refusal (e.g. roles out of order)
        raise Skip(f"the chat template refused it: {e}")
    spans = reply_spans(text, msgs, eot)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, mask = list(enc["input_ids"]), mask_tokens(enc["offset_mapping"], spans)
    if max_len:
        ids, mask = ids[:max_len], mask[:max_len]
    if not any(mask):
        raise Skip("no assistant token left" + (f" in the first {max_len}" if max_len else ""))
    return ids, mask


def read_objects(path):
    """(line number, parsed object or the parse error) of each conversation in path."""
    with open(path, encoding="utf-8") as f:
        data = f.read()
    if data.lstrip().startswith("["):
        for i, obj in enumerate(json.loads(data)):
            yield i + 1, obj
        return
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                yield n, Skip(f"not JSON: {e}")


def run(tok, src, dst, template_kwargs, max_len, log=sys.stderr, max_reports=20):
    """Converts src into dst (through dst.tmp, renamed at the end; nothing is left when no
    conversation is kept); returns (written, skipped, tokens, trained tokens)."""
    eot = end_of_turn(tok, template_kwargs)
    written = skipped = tokens = trained = 0
    tmp = dst + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for n, obj in read_objects(src):
                try:
                    if isinstance(obj, Skip):
                        raise obj
                    ids, mask = convert(tok, obj, eot, template_kwargs, max_len)
                except Skip as e:
                    skipped += 1
                    if skipped <= max_reports:
                        print(f"{src}:{n}: skipped: {e}", file=log)
                    continue
                out.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
                written, tokens, trained = written + 1, tokens + len(ids), trained + sum(mask)
                if written % 10000 == 0:
                    print(f"  {written} conversations, {tokens} tokens", file=log)
        if written:
            os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return written, skipped, tokens, trained


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True,
                    help="Hugging Face tokenizer or model directory (the target's)")
    ap.add_argument("--in", dest="src", required=True, help="conversations (JSONL or JSON array)")
    ap.add_argument("--out", required=True, help="JSONL for dflash-data (written atomically)")
    ap.add_argument("--max-len", type=int, default=0,
                    help="keep the first N tokens of each conversation (0: all; dflash-data "
                         "skips lines longer than its --max-len)")
    ap.add_argument("--template-kwargs", default="{}",
                    help='JSON object passed to apply_chat_template, e.g. \'{"enable_thinking": '
                         'false}\'')
    a = ap.parse_args(argv)
    if a.max_len < 0:  # ids[:-N] would cut N tokens off every conversation
        ap.error(f"--max-len must be 0 (all) or a positive token count, not {a.max_len}")
    try:
        kwargs = json.loads(a.template_kwargs)
        assert isinstance(kwargs, dict)
    except (ValueError, AssertionError):
        ap.error("--template-kwargs must be a JSON object")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit("chat_to_jsonl: needs the transformers package (pip install transformers)")
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    if not getattr(tok, "is_fast", False):
        sys.exit(f"chat_to_jsonl: {a.tokenizer}: a fast tokenizer (tokenizer.json) is needed for "
                 "the token offsets")
    if not getattr(tok, "chat_template", None):
        sys.exit(f"chat_to_jsonl: {a.tokenizer} has no chat template")
    written, skipped, tokens, trained = run(tok, a.src, a.out, kwargs, a.max_len)
    print(f"{a.out}: {written} conversations, {tokens} tokens ({trained} trained, "
          f"{100.0 * trained / max(tokens, 1):.1f}%), {skipped} skipped", file=sys.stderr)
    if written == 0:
        sys.exit(3)  # as dflash-data: nothing kept, nothing written


if __name__ == "__main__":
    main()
