"""Tiny random Llama-3, Qwen2 and Qwen3 checkpoints, with reference logits and greedy ids from transformers.

For each architecture the runtime supports beyond plain Llama, a scaled-down copy of a real config is built
by transformers itself (hidden 64, 2 layers, 4 query heads over 2 key/value heads, vocabulary 128):

* `llama3`: LlamaForCausalLM with Llama 3.1/3.2's RoPE (theta 500000, `rope_scaling` of type `llama3`,
  factor 32, low/high frequency factors 1/4, original context 8192) and an untied head. With head_dim 16
  the eight RoPE frequencies cover all three bands of the scaling: four unscaled, one interpolated, three
  divided by 32. One prompt is 64 tokens long, so the rotations of the scaled bands differ visibly from
  unscaled ones.
* `qwen2`: Qwen2ForCausalLM (bias on q/k/v, tied embedding as in Qwen2-0.5B, theta 1000000).
* `qwen3`: Qwen3ForCausalLM (RMS norms on q and k per head, head_dim 32 != hidden 64 / 4 heads, tied;
  intermediate 96 to keep the file small).

Every weight is redrawn from a fixed seed at scales that make the computation non-trivial: unit-variance
embeddings, linears at about 1/sqrt(fan_in) (q/k larger so attention is not uniform), norm weights around
1 +- 0.3 and q/k/v biases at 0.5, so that a runtime that ignored a norm weight, a bias or the rope scaling
would produce visibly different logits. The seeds (one per model; prompts from seed + 1) are the first of
1..12 whose greedy steps all have a top-2 logit gap of at least 0.05, so no step is a near-tie. `feature_sensitivity` in each reference.json records by how much
(the largest change of the prompt's last logits when the feature is turned off in transformers).

Each model is saved with `save_pretrained(safe_serialization=True)` in float32 (config.json and
model.safetensors; the generation config is dropped) and run in float32 with eager attention. For every
prompt the reference records the last position's logits and 8 greedy new ids (`generate(do_sample=False,
use_cache=True)` with no end-of-sequence id, so all 8 are produced), with the top-2 logit gap at each step.

    /tmp/torchenv/bin/python scripts/arch_reference.py crates/int4/tests/fixtures/arch
"""
import copy
import json
import os
import platform
import sys

import torch
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

COMMAND = "/tmp/torchenv/bin/python scripts/arch_reference.py crates/int4/tests/fixtures/arch"
NEW_TOKENS = 8
VOCAB = 128

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=0,
    eos_token_id=None,
    pad_token_id=None,
    torch_dtype="float32",
)


def llama3():
    cfg = LlamaConfig(
        **COMMON,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    return cfg, LlamaForCausalLM


def qwen2():
    cfg = Qwen2Config(
        **COMMON,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    return cfg, Qwen2ForCausalLM


def qwen3():
    cfg = Qwen3Config(
        **{**COMMON, "intermediate_size": 96},
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
    )
    return cfg, Qwen3ForCausalLM


def randomize(model, seed):
    """Redraws every parameter from `seed` (names sorted, so the draw does not depend on module order)."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                # RMSNorm gains (input/post-attention/final, and Qwen3's q_norm/k_norm).
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name == "model.embed_tokens.weight":
                # A tied table is also the head: smaller, so the residual stream is not dominated by the
                # input token's own row (which would make greedy decoding repeat it).
                scale = 0.3 if model.config.tie_word_embeddings else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5 * 3.0)
            else:
                gain = 2.0 if any(t in name for t in (".q_proj.", ".k_proj.", ".o_proj.", ".down_proj.")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5 * gain)


def prompts_for(name, seed):
    g = torch.Generator().manual_seed(seed + 1)
    lengths = {"llama3": [12, 19, 64], "qwen2": [11, 17, 23], "qwen3": [10, 16, 21]}[name]
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def last_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def greedy(model, ids):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            use_cache=True,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, len(ids):].tolist()
    gaps = []
    for s in out.scores:
        top = torch.topk(s[0].double(), 2).values
        gaps.append(float(top[0] - top[1]))
    # The same ids by full recomputation at every step (no cache), as a check on generate itself.
    seq = list(ids)
    for _ in range(NEW_TOKENS):
        seq.append(int(torch.argmax(last_logits(model, seq))))
    assert seq[len(ids):] == new, (seq[len(ids):], new)
    return new, gaps


def variant(cfg, cls, state, edit_cfg=None, edit_state=None):
    cfg = copy.deepcopy(cfg)
    if edit_cfg:
        edit_cfg(cfg)
    m = cls(cfg).eval()
    state = {k: v.clone() for k, v in state.items()}
    if edit_state:
        edit_state(state)
    m.load_state_dict(state, strict=False)
    if cfg.tie_word_embeddings:
        m.tie_weights()
    return m


def max_diff(a, b):
    return float((a.double() - b.double()).abs().max())


def sensitivity(name, cfg, cls, model, prompts):
    state = model.state_dict()
    ref = [last_logits(model, p) for p in prompts]

    def worst(m):
        return max(max_diff(last_logits(m, p), r) for p, r in zip(prompts, ref))

    def unit_norms(s, which):
        for k in s:
            if k.endswith("norm.weight") and which(k):
                s[k].fill_(1.0)

    out = {
        "layer_norm_weights_set_to_1": worst(
            variant(cfg, cls, state, edit_state=lambda s: unit_norms(s, lambda k: "q_norm" not in k and "k_norm" not in k))
        )
    }
    if name == "llama3":

        def no_scaling(c):
            c.rope_scaling = None

        out["rope_scaling_removed"] = worst(variant(cfg, cls, state, edit_cfg=no_scaling))
        # The same for the longest prompt alone.
        long_only = variant(cfg, cls, state, edit_cfg=no_scaling)
        out["rope_scaling_removed_longest_prompt"] = max_diff(last_logits(long_only, prompts[-1]), ref[-1])
    if name == "qwen2":

        def zero_bias(s):
            for k in s:
                if k.endswith(".bias"):
                    s[k].zero_()

        out["qkv_bias_zeroed"] = worst(variant(cfg, cls, state, edit_state=zero_bias))
    if name == "qwen3":
        out["qk_norm_weights_set_to_1"] = worst(
            variant(cfg, cls, state, edit_state=lambda s: unit_norms(s, lambda k: "q_norm" in k or "k_norm" in k))
        )
    return out


def build(name, make, seed, out_root):
    torch.manual_seed(seed)
    cfg, cls = make()
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    randomize(model, seed)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    gen = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    # Reload what was written, so the references come from the saved weights exactly.
    model = cls.from_pretrained(out_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()

    prompts = prompts_for(name, seed)
    cases = []
    for i, ids in enumerate(prompts):
        logits = last_logits(model, ids)
        new, gaps = greedy(model, ids)
        cases.append(
            {
                "name": f"prompt_{i}",
                "prompt_ids": ids,
                "last_logits": [float(x) for x in logits.tolist()],
                "greedy_ids": new,
                "greedy_top2_gaps": gaps,
            }
        )
        print(f"{name} prompt_{i} len {len(ids)} greedy {new} min gap {min(gaps):.4f}", flush=True)
    sens = sensitivity(name, cfg, cls, model, prompts)
    print(f"{name} sensitivity {sens}", flush=True)
    inv_freq = model.model.rotary_emb.inv_freq.double().tolist()
    doc = {
        "generated_by": "scripts/arch_reference.py",
        "command": COMMAND,
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "architecture": cfg.architectures[0] if cfg.architectures else cls.__name__,
        "seed": seed,
        "dtype": "float32",
        "attn_implementation": "eager",
        "rope_inv_freq": inv_freq,
        "new_tokens": NEW_TOKENS,
        "feature_sensitivity": sens,
        "cases": cases,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    print(f"{name}: model.safetensors {size} bytes", flush=True)


def main():
    out_root = sys.argv[1]
    torch.set_num_threads(2)
    for name, make, seed in [("llama3", llama3, 8), ("qwen2", qwen2, 1), ("qwen3", qwen3, 9)]:
        build(name, make, seed, out_root)


if __name__ == "__main__":
    main()
