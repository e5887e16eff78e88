#!/usr/bin/env python3
r"""chat_to_jsonl: chat conversations to the tokenized JSONL that dflash-data reads.

    scripts/chat_to_jsonl.py --tokenizer /models/Qwen3-8B --in chats.jsonl --out train.jsonl

Input: JSONL, one conversation per line, or one JSON array of them; each is an object with
"messages" ([{"role", "content"}], OpenAI style) or "conversations" (ShareGPT style, "from" /
"value" or "role" / "content"; human -> user, gpt -> assistant). Output: one line per
conversation, {"input_ids": [...], "loss_mask": [...]}, the conversation rendered by the
tokenizer's own chat template (Hugging Face transformers, a fast tokenizer) and tokenized; the
loss mask is 1 on the tokens of each assistant reply and the end-of-turn marker after it (what
the target generates; the DFlash recipe trains only there), 0 on everything else (system and
user turns, the template's markup and the reasoning block it inserts, the generation prompt).

How the replies are found: by construction, not by searching the rendering for their text (a
reply "a" or "end" also occurs in the markup, "<|im_start|>", "<|im_end|>"), nor by rendering
prefixes of the conversation (a template may render a turn differently once later turns follow:
Qwen3 writes an empty <think> block before the last reply only and drops earlier replies'
reasoning). For each reply the conversation is rendered again with that reply replaced by a
sentinel that occurs nowhere else, which splits into B (before) and A (after); the real rendering
must be B + the reply + A, the reply as given or with its surrounding whitespace trimmed (Llama 3
trims), or B cut short + the reply as given + A (Qwen3's last reply "<think>\nR\n</think>\n\nA"
takes the place of the empty <think> block). The span is the reply, plus the end-of-turn marker
(learnt the same way from a probe) when A starts with it. A reply the template rewrites otherwise
(Qwen3 drops earlier replies' reasoning) skips its line, with the reason; an empty reply masks
nothing. Tokens whose character offsets overlap a span are masked. Lines that cannot be converted
are reported with their line number and reason (the first 20) and tallied by kind of reason in
the summary. Needs transformers only when run (the span logic is tested in CI with stand-in
tokenizers: tests/unit/test_chat_to_jsonl.py).
"""
import argparse
import collections
import json
import os
import sys

ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "model": "assistant", "chatgpt": "assistant", "system": "system"}
PROBE_USER = "probe question 1729"


class Skip(Exception):
    """A conversation that cannot be converted: the reason, for the FILE:LINE report, and its
    kind, the summary's tally of skipped lines by reason."""

    def __init__(self, reason, kind):
        super().__init__(reason)
        self.kind = kind


def normalize(obj):
    """The conversation of one input object as [{"role", "content"}] with known roles."""
    if not isinstance(obj, dict):
        raise Skip("not a JSON object", "not a conversation")
    turns = obj.get("messages", obj.get("conversations"))
    if not isinstance(turns, list) or not turns:
        raise Skip('no "messages" or "conversations" list', "not a conversation")
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise Skip(f"message {i} is not an object", "not a conversation")
        role = t.get("role", t.get("from"))
        text = t.get("content", t.get("value"))
        if not isinstance(role, str) or role.lower() not in ROLES:
            raise Skip(f"message {i}: unknown role {role!r} (known: {', '.join(sorted(ROLES))})",
                       "unknown role")
        if not isinstance(text, str):
            raise Skip(f"message {i}: content is not a string", "not a conversation")
        out.append({"role": ROLES[role.lower()], "content": text})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in out):
        raise Skip("no assistant reply", "no assistant reply")
    return out


def render(tok, msgs, template_kwargs):
    """The template's rendering of msgs (text, no generation prompt)."""
    try:
        return tok.apply_chat_template(msgs, tokenize=False, **template_kwargs)
    except Exception as e:  # the template's own refusal (e.g. roles out of order)
        raise Skip(f"the chat template refused it: {e}", "refused by the template")


def around(tok, msgs, k, template_kwargs):
    """(B, A): the rendering of msgs with message k's content replaced by a sentinel that occurs
    nowhere else, split at the sentinel; None when the template does not write it exactly once."""
    sentinel = "c2j4104sentinel"
    while any(sentinel in m["content"] for m in msgs):
        sentinel += "x"
    probe = msgs[:k] + [dict(msgs[k], content=sentinel)] + msgs[k + 1:]
    parts = render(tok, probe, template_kwargs).split(sentinel)
    return tuple(parts) if len(parts) == 2 else None


def end_of_turn(tok, template_kwargs):
    """What the template writes after an assistant reply (e.g. "<|im_end|>"), or "" if nothing."""
    msgs = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": ""}]
    try:
        ba = around(tok, msgs, 1, template_kwargs)
    except Skip as e:
        raise SystemExit(f"chat_to_jsonl: a probe conversation: {e}")
    if ba is None:
        raise SystemExit("chat_to_jsonl: the chat template does not write an assistant reply's "
                         "text once in a probe conversation: cannot locate replies")
    return ba[1].strip()


def locate(text, before, after, reply):
    """[start, end) of the reply in text (the conversation's rendering) given the rendering of
    the rest, before + sentinel + after; None when text is not of the forms the module's comment
    allows (the template rewrote the reply, or rendered the rest differently because of it)."""
    end = len(text) - len(after)
    if end < 0 or text[end:] != after:
        return None
    if len(before) <= end and text.startswith(before):  # the reply in its slot, maybe trimmed
        got = text[len(before):end]
        if got.strip() == reply.strip() and got in reply:
            return len(before), end
    for got in (reply, reply.strip()):  # verbatim, in place of markup before an empty slot
        start = end - len(got)
        if 0 <= start <= len(before) and text[start:end] == got and text.startswith(before[:start]):
            return start, end
    return None


def reply_spans(tok, text, msgs, eot, template_kwargs):
    """[start, end) character ranges in text, the rendering of msgs, of each non-empty assistant
    reply plus eot when it follows; raises Skip for a reply the template does not render as
    given."""
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant" or not m["content"].strip():
            continue
        ba = around(tok, msgs, k, template_kwargs)
        span = ba and locate(text, ba[0], ba[1], m["content"])
        if not span:
            raise Skip(f"message {k} (assistant): the chat template does not render this reply "
                       "as given (it rewrites it, e.g. drops or moves its reasoning), so its "
                       "tokens cannot be located exactly", "reply rewritten by the template")
        start, end = span
        if eot and ba[1].startswith(eot):
            end += len(eot)
        spans.append((start, end))
    return sorted(spans)


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
    text = render(tok, msgs, template_kwargs)
    spans = reply_spans(tok, text, msgs, eot, template_kwargs)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, mask = list(enc["input_ids"]), mask_tokens(enc["offset_mapping"], spans)
    if max_len:
        ids, mask = ids[:max_len], mask[:max_len]
    if not any(mask):
        raise Skip("no assistant token left" + (f" in the first {max_len}" if max_len else ""),
                   "no assistant token left")
    return ids, mask


class InputError(Exception):
    """An input that cannot be read as conversations at all (said, exit 2)."""


BOM = b"\xef\xbb\xbf"


def read_objects(path):
    """(line number, parsed object or a Skip with the reason) of each conversation in path: a
    JSONL file line by line (one line in memory at a time; lines end at "\n" only, as JSON
    strings may hold U+2028 raw), or one JSON array, read whole. A UTF-8 byte-order mark is
    dropped. A line that is not UTF-8 or not JSON is skipped with its reason; a file that starts
    with "[" and is not one JSON array raises InputError."""
    with open(path, "rb", buffering=64 * 1024) as f:  # a pipe too: looked at, never seeked
        if f.peek(64 * 1024)[:64 * 1024].removeprefix(BOM).lstrip().startswith(b"["):
            try:
                objs = json.loads(f.read().removeprefix(BOM).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise InputError(f"{path} starts with '[' but is not one JSON array ({e}): give "
                                 "a JSON array of conversations, or one conversation object "
                                 "per line (JSONL)") from None
            if not isinstance(objs, list):
                raise InputError(f"{path} is not a JSON array of conversations")
            for i, obj in enumerate(objs):
                yield i + 1, obj
            return
        for n, raw in enumerate(f, 1):
            if n == 1:
                raw = raw.removeprefix(BOM)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, Skip(f"not UTF-8 ({e})", "not UTF-8")
                continue
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as e:
                    yield n, Skip(f"not JSON: {e}", "not JSON")


def remove_stale_temps(dst, log):
    """Removes dst.tmp.PID files whose process is gone (a conversion killed outright)."""
    folder, base = os.path.split(os.path.abspath(dst))
    for name in os.listdir(folder):
        pid = name[len(base) + 5:] if name.startswith(base + ".tmp.") else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or not ours to signal): its conversion, left alone
        except ProcessLookupError:
            pass
        except OSError:
            continue
        os.unlink(os.path.join(folder, name))
        print(f"removed {os.path.join(folder, name)}: a partial conversion left by process "
              f"{pid}, which is gone", file=log)


def run(tok, src, dst, template_kwargs, max_len, log=sys.stderr, max_reports=20):
    """Converts src into dst (through dst.tmp, renamed at the end; nothing is left when no
    conversation is kept) and says the summary; returns (written, skipped: a Counter of their
    kinds, tokens, trained tokens)."""
    eot = end_of_turn(tok, template_kwargs)
    written = tokens = trained = 0
    skipped = collections.Counter()
    remove_stale_temps(dst, log)
    tmp = f"{dst}.tmp.{os.getpid()}"  # two conversions to one output do not share it
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for n, obj in read_objects(src):
                try:
                    if isinstance(obj, Skip):
                        raise obj
                    ids, mask = convert(tok, obj, eot, template_kwargs, max_len)
                except Skip as e:
                    skipped[e.kind] += 1
                    if sum(skipped.values()) <= max_reports:
                        print(f"{src}:{n}: skipped: {e}", file=log)
                    continue
                out.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
                written, tokens, trained = written + 1, tokens + len(ids), trained + sum(mask)
                if written % 10000 == 0:
                    print(f"  {written} conversations, {tokens} tokens", file=log)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a power loss keeps old or new
        if written:
            os.replace(tmp, dst)
            dir_fd = os.open(os.path.dirname(os.path.abspath(dst)), os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself
            finally:
                os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    kinds = ", ".join(f"{kind}: {n}" for kind, n in skipped.most_common())
    if sum(skipped.values()) > max_reports:
        kinds += f"; the first {max_reports} reported above"
    print(f"{dst}: {written} conversations, {tokens} tokens ({trained} trained, "
          f"{100.0 * trained / max(tokens, 1):.1f}%), {sum(skipped.values())} skipped"
          + (f" ({kinds})" if kinds else ""), file=log)
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
    if not os.path.exists(a.src) or os.path.isdir(a.src) or not os.access(a.src, os.R_OK):
        ap.error(f"--in {a.src}: no readable file there")  # (a pipe is read: <(zcat ...))
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        ap.error(f"--out {a.out}: its folder {out_dir} does not exist")
    if os.path.exists(a.out) and os.path.samefile(a.src, a.out):
        ap.error(f"--out {a.out} is --in: the conversations would be replaced by their tokens; "
                 "give another --out")
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
    try:
        written = run(tok, a.src, a.out, kwargs, a.max_len)[0]
    except InputError as e:
        sys.exit(f"chat_to_jsonl: {e}")
    if written == 0:
        sys.exit(3)  # as dflash-data: nothing kept, nothing written


if __name__ == "__main__":
    main()
