#!/usr/bin/env python3
"""Record the bytes of PyTorch's CPU int4 weight packer as a JSON test fixture.

What it does
------------
PyTorch's ``torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, inner_k_tiles)``
takes int32 codes ``[N, K]`` (values 0..15) and returns a uint8 tensor whose byte
layout depends on the CPU capability the ATen dispatcher picked at run time
(AVX512 and AVX2 kernels pack differently).  This script records the exact
bytes it returns, for both capabilities, so the Rust crate ``int4-layout`` can
compare its own packer byte for byte without PyTorch being installed.

For each capability in ("avx512", "avx2") the script re-runs itself in a child
process with ``ATEN_CPU_CAPABILITY`` set in the child's environment *before*
torch is imported (the capability is read when ATen first dispatches).  The
child checks that ``torch.backends.cpu.get_cpu_capability()`` reports the
requested capability (the reported string is stored with every case) and
fails otherwise.  The machine must support AVX-512 for the avx512 run.

For N in (16, 32, 48, 64, 80, 144), K in (2, 8, 64, 130) and two code
patterns (formulas below, evaluated with Python integers) it calls the packer
with inner_k_tiles = 1 and stores shape, dtype and the result's bytes
(``.contiguous().view(torch.uint8)`` flattened, lowercase hex).  If torch
rejects a case, the error message is stored (``"error"``) instead of bytes.
The input codes are not stored: the formulas define them.

    mix:  code[n][k] = (n * 7 + k * 3 + ((n * k) % 5)) % 16
    hash: code[n][k] = (((n * 2654435761) + (k * 40503) + 12345) >> 7) % 16

Output: crates/int4-layout/tests/fixtures/pytorch_int4pack.json (relative to
the repository root; the path is resolved from this file's location).

How to run (once, by hand; NOT run by CI)
-----------------------------------------
Use a throwaway virtualenv outside the repository.  PyPI only has CUDA builds
of torch for Linux, so the nvidia-* wheels come along (about 5 GB); the CPU
kernels are what is exercised, no GPU is needed.  Generated with
torch 2.15.0 (+cu132 wheel from PyPI) on Python 3.11.7, on an AMD Zen 4 CPU:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.15.0
    /tmp/torchenv/bin/python scripts/pytorch_int4pack_fixture.py

(run from the repository root).  Commit the regenerated JSON if it changes.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

CAPABILITIES = ("avx512", "avx2")
NS = (16, 32, 48, 64, 80, 144)
KS = (2, 8, 64, 130)
INNER_K_TILES = 1

PATTERNS = {
    "mix": "code[n][k] = (n * 7 + k * 3 + ((n * k) % 5)) % 16",
    "hash": "code[n][k] = (((n * 2654435761) + (k * 40503) + 12345) >> 7) % 16",
}

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_PATH = REPO_ROOT / "crates" / "int4-layout" / "tests" / "fixtures" / "pytorch_int4pack.json"
CHILD_FLAG = "--child"


def code(pattern, n, k):
    if pattern == "mix":
        return (n * 7 + k * 3 + ((n * k) % 5)) % 16
    if pattern == "hash":
        return (((n * 2654435761) + (k * 40503) + 12345) >> 7) % 16
    raise ValueError(pattern)


def codes(pattern, n_total, k_total):
    return [[code(pattern, n, k) for k in range(k_total)] for n in range(n_total)]


def child(capability):
    """Runs inside a subprocess whose ATEN_CPU_CAPABILITY is already set."""
    assert os.environ.get("ATEN_CPU_CAPABILITY") == capability
    import torch

    reported = torch.backends.cpu.get_cpu_capability()
    if reported.lower() != capability:
        raise SystemExit(
            f"requested ATEN_CPU_CAPABILITY={capability} but torch reports {reported}"
        )
    cases = []
    for pattern in PATTERNS:
        for n in NS:
            for k in KS:
                case = {
                    "capability": capability,
                    "reported_capability": reported,
                    "pattern": pattern,
                    "n": n,
                    "k": k,
                }
                try:
                    t = torch.tensor(codes(pattern, n, k), dtype=torch.int32)
                    out = torch.ops.aten._convert_weight_to_int4pack_for_cpu(t, INNER_K_TILES)
                    case["shape"] = list(out.shape)
                    case["dtype"] = str(out.dtype)
                    flat = out.contiguous().view(torch.uint8).flatten()
                    case["packed_hex"] = bytes(flat.tolist()).hex()
                except Exception as e:  # torch rejected this (N, K)
                    case["error"] = str(e)
                cases.append(case)
    json.dump({"torch_version": torch.__version__, "cases": cases}, sys.stdout)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == CHILD_FLAG:
        child(sys.argv[2])
        return
    all_cases = []
    torch_version = None
    for cap in CAPABILITIES:
        env = dict(os.environ, ATEN_CPU_CAPABILITY=cap)
        res = subprocess.run(
            [sys.executable, os.path.abspath(__file__), CHILD_FLAG, cap],
            env=env,
            stdout=subprocess.PIPE,
            check=True,
        )
        data = json.loads(res.stdout)
        torch_version = data["torch_version"]
        all_cases.extend(data["cases"])

    header = {
        "torch_version": torch_version,
        "python_version": platform.python_version(),
        "generated_by": "scripts/pytorch_int4pack_fixture.py",
        "command": "python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.15.0"
        " && /tmp/torchenv/bin/python scripts/pytorch_int4pack_fixture.py",
        "inner_k_tiles": INNER_K_TILES,
        "patterns": PATTERNS,
    }
    # One case per line, keeping the file diff-friendly.
    head = json.dumps(header, indent=1)[:-2]  # drop the closing "\n}"
    body = ",\n".join("  " + json.dumps(c, separators=(", ", ": ")) for c in all_cases)
    text = head + ',\n "cases": [\n' + body + "\n ]\n}\n"
    json.loads(text)  # sanity: valid JSON
    OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
    OUT_PATH.write_text(text)
    print(f"wrote {OUT_PATH} ({len(all_cases)} cases, torch {torch_version})")


if __name__ == "__main__":
    main()
