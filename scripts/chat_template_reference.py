"""Expected renders of real chat templates, from transformers itself.

For every template in crates/int4-template/tests/fixtures/templates/ and every case in
crates/int4-template/tests/fixtures/cases.json, renders the conversation the way
`PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False)` does: the messages normalized by
`_normalize_chat_messages` (keys whose value is None dropped), then `render_jinja_template` with the tools,
`add_generation_prompt`, the tokenizer's named special tokens and the case's extra keyword arguments, in the
environment transformers compiles (`_compile_jinja_template`: ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now). `strftime_now` reads a fixed clock
(the cases' "clock", patched into the module's `datetime`), so the date a template prints is reproducible.

The special tokens are those each model's tokenizer_config.json names (recorded in cases.json, so no model
files are needed). A case whose template raises records the error's message instead of a render.

Writes crates/int4-template/tests/fixtures/expected.json; crates/int4-template/tests/real_templates.rs
renders the same cases with int4-template and compares byte for byte.

Run by hand (not by CI), from the repository root, in a throwaway virtualenv:

    python3 -m venv /tmp/tplenv
    /tmp/tplenv/bin/pip install transformers==5.24.0 jinja2==3.1.6
    /tmp/tplenv/bin/python scripts/chat_template_reference.py
"""

import datetime as _dt
import json
import pathlib

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/int4-template/tests/fixtures"


def main():
    cases = json.loads((FIXTURES / "cases.json").read_text())
    clock = _dt.datetime.fromisoformat(cases["clock"])

    class FixedDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return clock if tz is None else clock.astimezone(tz)

    ctu.datetime = FixedDatetime
    out = {
        "generator": "scripts/chat_template_reference.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "renders": [],
    }
    for model, spec in cases["models"].items():
        template = (FIXTURES / "templates" / f"{model}.jinja").read_text()
        for case in cases["cases"]:
            if "only" in case and model not in case["only"]:
                continue
            if case.get("tools") and not spec["tools"]:
                continue
            messages = ctu._normalize_chat_messages(json.loads(json.dumps(case["messages"])))
            tools = cases["tools"] if case.get("tools") else None
            kwargs = {**spec["special_tokens"], **case.get("extra", {})}
            entry = {"model": model, "case": case["name"]}
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[messages],
                    tools=tools,
                    chat_template=template,
                    add_generation_prompt=case["add_generation_prompt"],
                    **kwargs,
                )
                entry["output"] = rendered[0]
            except jinja2.exceptions.TemplateError as e:
                entry["error"] = str(e)
            out["renders"].append(entry)
    path = FIXTURES / "expected.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out['renders'])} renders to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
