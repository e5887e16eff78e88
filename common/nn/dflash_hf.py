"""dflash.py: the DFlash drafter as a Hugging Face transformers model.

dflash-drafter writes this file, under the name dflash.py, beside config.json in every
checkpoint (the source is common/nn/dflash_hf.py, built into the binary). config.json's auto_map
names it, so

    model = AutoModel.from_pretrained(CKPT, trust_remote_code=True, dtype=torch.bfloat16)

loads the drafter with the weights of model.safetensors (names of dflash.md 2.2, no "model."
prefix). SGLang and vLLM load the same checkpoint with their own DFlash code and ignore this file.

What the drafter computes (dflash.md 1.4-1.5), for one block of Q positions after S context
tokens:
    ctx = hidden_norm(fc(target_hidden))                    [S, D]  same for every layer
    h   = noise_embedding                                   [Q, D]  the target's embeddings of
                                                            the anchor token, then Q-1 MASK tokens
    per layer: x = input_layernorm(h)
               q = rope(q_norm(q_proj(x)))                  the block's queries
               k = rope(k_norm(k_proj([ctx; x])))           keys and values over context + block
               v = v_proj([ctx; x])
               h = h + o_proj(attention(q, k, v, mask))     each query sees the context and the
                                                            whole block (bidirectional)
               h = h + down_proj(silu(gate_proj(y)) * up_proj(y)),  y = post_attention_layernorm(h)
    return norm(h)                                          logits = the target's lm_head of it
The drafter owns no embedding and no lm_head: both are the target's (frozen), so the caller
passes the embeddings in and applies the lm_head to what comes out.

target_hidden is what the target's decoder layers dflash_config.target_layer_ids output, in that
order, concatenated on the last axis: with transformers' output_hidden_states, layer id k is
hidden_states[k + 1] (target_features() does this). Positions are absolute: the context's tokens
are 0..S-1 and the block's anchor is at S when the context is everything before it.

Drafting one block after the prompt ids [1, S+1] (its last token is the anchor):
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.bfloat16)
    drafter = AutoModel.from_pretrained(CKPT, trust_remote_code=True, dtype=torch.bfloat16)
    out = target(ids, output_hidden_states=True)
    ctx = drafter.target_features(out.hidden_states)[:, :-1]      # the S tokens before it
    emb = target.get_input_embeddings()(drafter.block_ids(ids[:, -1]))
    draft = target.lm_head(drafter(emb, ctx)).argmax(-1)[:, 1:]   # block_size - 1 tokens

or the whole greedy speculative decoding loop, the target verifying every block (the output is
the target's own greedy continuation; drafter.acceptance holds each cycle's accepted length):
    out = drafter.spec_generate(input_ids=ids, target=target, max_new_tokens=512,
                                stop_token_ids=[tokenizer.eos_token_id])

A reference implementation, not a fast one: the drafter keeps no KV cache (each block attends
over the whole context again), attention is plain matrix products (memory grows with
Q x (S + Q)), one prompt at a time, greedy only. Serve with SGLang or vLLM.
Without transformers installed the classes still import (the base class is then
torch.nn.Module), which is how dflash's own tests check the maths against the training code.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

try:
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3PreTrainedModel as _Base
except ImportError:
    Qwen3Config = None
    _Base = nn.Module


def _rope_theta(config):
    """theta of plain RoPE, from rope_theta or (transformers 5) rope_parameters; other RoPE
    types are refused (the drafter is trained with plain RoPE)."""
    params = getattr(config, "rope_parameters", None) or {}
    for rope in (params, getattr(config, "rope_scaling", None) or {}):
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ValueError("dflash.py: the drafter uses plain RoPE; this config asks for %r"
                             % kind)
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def _wide(x):
    """x in float32 at least: norms and softmax of bf16 / fp16 models run in float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _rotate(x, cos, sin):
    """RoPE in the rotate-half layout. x [b, n, heads, d]; cos, sin [b, n, d]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None, :] + turned * sin[:, :, None, :]


class DFlashRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        # as transformers' Qwen3RMSNorm and our kernels: normalised in fp32, rounded to x's
        # dtype, then multiplied by the weight in that dtype
        xw = _wide(x)
        y = xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * y.to(x.dtype)


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, y):
        return self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class DFlashAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        d, eps = self.head_dim, config.rms_norm_eps
        self.q_proj = nn.Linear(config.hidden_size, self.heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, config.hidden_size, bias=False)
        self.q_norm = DFlashRMSNorm(d, eps)
        self.k_norm = DFlashRMSNorm(d, eps)

    def forward(self, x, ctx, cos, sin, visible):
        """x [b, Q, D] (input-normed block), ctx [b, S, D]; cos, sin [b, S+Q, d];
        visible [b, Q, S+Q] bool."""
        b, nq, _ = x.shape
        d, groups = self.head_dim, self.heads // self.kv_heads
        both = torch.cat([ctx, x], dim=1)
        nk = both.shape[1]
        q = _rotate(self.q_norm(self.q_proj(x).view(b, nq, self.heads, d)),
                    cos[:, nk - nq:], sin[:, nk - nq:])
        k = _rotate(self.k_norm(self.k_proj(both).view(b, nk, self.kv_heads, d)), cos, sin)
        v = self.v_proj(both).view(b, nk, self.kv_heads, d)
        q = q.transpose(1, 2)                                         # [b, H, Q, d]
        k = k.transpose(1, 2).repeat_interleave(groups, dim=1)        # [b, H, S+Q, d]
        v = v.transpose(1, 2).repeat_interleave(groups, dim=1)
        scores = torch.matmul(_wide(q), _wide(k).transpose(2, 3)) / math.sqrt(d)
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, nq, self.heads * d))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(self, h, ctx, cos, sin, visible):
        h = h + self.self_attn(self.input_layernorm(h), ctx, cos, sin, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(_Base):
    """The drafter of config.json (dflash_config.target_layer_ids, mask_token_id, block_size)."""
    config_class = Qwen3Config
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config):
        if _Base is nn.Module:
            super().__init__()
            self.config = config
        else:
            super().__init__(config)
        dflash = getattr(config, "dflash_config", None) or {}
        self.target_layer_ids = list(dflash.get("target_layer_ids") or [])
        if not self.target_layer_ids:
            raise ValueError("dflash.py: config.json has no dflash_config.target_layer_ids")
        self.mask_token_id = int(dflash["mask_token_id"])
        self.block_size = int(getattr(config, "block_size", None) or dflash.get("block_size", 16))
        self.rope_theta = _rope_theta(config)
        n_in = len(self.target_layer_ids) * config.hidden_size
        self.fc = nn.Linear(n_in, config.hidden_size, bias=False)
        self.hidden_norm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.norm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        if _Base is not nn.Module:
            self.post_init()

    def target_features(self, hidden_states):
        """target_hidden from a target's output_hidden_states: the outputs of the decoder layers
        target_layer_ids (hidden_states[k + 1]) concatenated on the last axis. transformers
        puts the final-normed state, not the last layer's output, at the end of hidden_states:
        a drafter that captures the last layer needs a forward hook on it instead."""
        last = len(hidden_states) - 2
        if last in self.target_layer_ids:
            raise ValueError("dflash.py: target layer %d is the target's last: its output is not "
                             "in output_hidden_states (the final norm is applied there); take "
                             "it with a forward hook on that decoder layer" % last)
        return torch.cat([hidden_states[k + 1] for k in self.target_layer_ids], dim=-1)

    def block_ids(self, anchor_ids):
        """Token ids of blocks to draft: each anchor id followed by block_size - 1 MASK ids.
        anchor_ids [b] -> [b, block_size]; embed them with the target's input embeddings."""
        ids = torch.full((anchor_ids.shape[0], self.block_size), self.mask_token_id,
                         dtype=torch.long, device=anchor_ids.device)
        ids[:, 0] = anchor_ids
        return ids

    def forward(self, noise_embedding, target_hidden, position_ids=None, attention_mask=None):
        """noise_embedding [b, Q, D]: the target's embeddings of block_ids(); target_hidden
        [b, S, n*D]: target_features() of the S context tokens; position_ids [b, S+Q] (default
        0..S+Q-1: the block right after its context); attention_mask [b, Q, S+Q] bool, True where
        a block position may attend (default: the whole context and the whole block).
        Returns the final-normed hidden states [b, Q, D]."""
        b, nq, _ = noise_embedding.shape
        ns = target_hidden.shape[1]
        dev = noise_embedding.device
        if position_ids is None:
            position_ids = torch.arange(ns + nq, device=dev).expand(b, -1)
        if attention_mask is None:
            attention_mask = torch.ones(b, nq, ns + nq, dtype=torch.bool, device=dev)
        d = self.layers[0].self_attn.head_dim
        inv = 1.0 / self.rope_theta ** (torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d)
        ang = position_ids.to(torch.float64)[..., None] * inv
        ang = torch.cat([ang, ang], dim=-1)
        dtype = noise_embedding.dtype
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        h = noise_embedding.to(ctx.dtype)
        for layer in self.layers:
            h = layer(h, ctx, cos, sin, attention_mask.bool())
        return self.norm(h)

    @torch.no_grad()
    def spec_generate(self, input_ids, target, max_new_tokens=256, temperature=0.0,
                      stop_token_ids=None):
        """Greedy speculative decoding of one prompt input_ids [1, n] with target (the
        transformers causal LM this drafter was trained on). Each cycle drafts a block after the
        last committed token, the target scores the block in one forward over its KV cache, and
        the drafted tokens that equal the target's greedy choice are kept, plus the target's
        token after them. Returns the prompt and the generated ids [1, n + new] (new <=
        max_new_tokens; it ends after a token of stop_token_ids). self.acceptance: the tokens
        each cycle committed (accepted drafts + 1); their mean is the acceptance length tau."""
        if temperature and temperature > 0:
            raise ValueError("dflash.py: spec_generate decodes greedily (temperature 0); sample "
                             "with SGLang or vLLM")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError("dflash.py: spec_generate takes one prompt, input_ids [1, n]")
        if max_new_tokens < 1:
            return input_ids
        stops = set(stop_token_ids or [])
        dev = input_ids.device
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        out = target(input_ids, use_cache=True, output_hidden_states=True)
        cache, feats = out.past_key_values, self.target_features(out.hidden_states)
        tokens = input_ids[0].tolist()
        anchor = int(out.logits[0, -1].argmax())
        made = [anchor]
        self.acceptance = []
        while len(made) < max_new_tokens and anchor not in stops:
            block = embed(self.block_ids(torch.tensor([anchor], device=dev)))
            hidden = self(block, feats)
            draft = head(hidden.to(head.weight.dtype)).argmax(-1)[0, 1:]
            verify = torch.cat([torch.tensor([anchor], device=dev), draft])[None]
            out = target(verify, past_key_values=cache, use_cache=True, output_hidden_states=True)
            greedy = out.logits[0].argmax(-1)
            a = 0
            while a < draft.shape[0] and int(draft[a]) == int(greedy[a]):
                a += 1
            feats = torch.cat([feats, self.target_features(out.hidden_states)[:, :a + 1]], dim=1)
            if a + 1 < verify.shape[1]:  # keep the cache through the last accepted draft
                cache.crop(a + 1 - verify.shape[1])
            before = len(made)
            for t in draft[:a].tolist() + [int(greedy[a])]:
                if len(made) == max_new_tokens or made[-1] in stops:
                    break
                made.append(t)
            self.acceptance.append(len(made) - before)
            anchor = made[-1]
        return torch.tensor([tokens + made], device=dev)
