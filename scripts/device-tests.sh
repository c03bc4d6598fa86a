#!/usr/bin/env bash
# Kernel tests on a lent machine that has no Rust toolchain (an Intel host with AMX, say).
#
#   scripts/device-tests.sh build   # here: static test binaries + a runner into target/device/
#   target/device/run.sh            # there (the `device` tool carries target/device): runs them all
#
# `build` compiles the test binaries of the crates whose tests need no model (int4-layout, int4-kernels,
# int4-select) as static executables, so they run on any x86-64 Linux whatever its C library, and copies
# them, stripped (the device tool carries at most 64 MiB; with their line tables they are ~170 MB), with run.sh
# into target/device/. run.sh prints the CPU's AMX/AVX-512 flags first, then runs every
# binary with INT4_TEST_EVERYTHING=1, so a kernel variant the host cannot run fails instead of being
# skipped quietly; its output goes to stdout and to $OUT/device-tests.log when $OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
build)
    target=x86_64-unknown-linux-gnu
    out=target/device
    rm -rf "$out"
    mkdir -p "$out/bin"
    RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR=target/device-build \
        cargo test --release --target "$target" -p int4-layout -p int4-kernels -p int4-select --no-run \
        --message-format json 2>/dev/null |
        python3 -c '
import json, subprocess, sys, shutil
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"] + "-" + m["package_id"].split("#")[-1].split("@")[0].split("/")[-1]
        shutil.copy(m["executable"], sys.argv[1] + "/" + name)
        subprocess.run(["strip", sys.argv[1] + "/" + name], check=True)
        print(name)
' "$out/bin"
    {
        echo '#!/usr/bin/env bash'
        echo '# Runs every copied test binary with INT4_TEST_EVERYTHING=1 (see scripts/device-tests.sh).'
        echo '# The binaries read fixtures under the checkout they were built in (built=, below). Where this'
        echo "# runner's checkout lies elsewhere, that path becomes a link to it; insta finds the workspace"
        echo '# root with cargo, which such a host lacks, so it is named.'
        printf 'built=%q\n' "$(pwd -P)"
    } >"$out/run.sh"
    cat >>"$out/run.sh" <<'EOF'
cd "$(dirname "$0")"
here=$(cd ../.. && pwd -P)
if [[ -L $built && ! $built -ef $here ]]; then
    rm "$built" # a link left by an earlier run, to another checkout or one that is gone
fi
if [[ ! -e $built ]]; then
    mkdir -p "$(dirname "$built")" && ln -s "$here" "$built" ||
        { echo "run.sh: cannot link $built to $here, where the tests read their fixtures" >&2; exit 2; }
elif [[ ! $built -ef $here ]]; then
    echo "run.sh: warning: $built is not this checkout; the tests read their fixtures there" >&2
fi
export INSTA_WORKSPACE_ROOT=$here INSTA_UPDATE=no
log="${OUT:-/tmp}/device-tests.log"
{
    echo "== CPU"
    lscpu | grep -i 'model name'
    echo "AMX/AVX-512 flags: $(grep -o -w -E 'amx_[a-z0-9]+|avx512[a-z0-9_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    status=0
    for t in bin/*; do
        echo "== $t"
        INT4_TEST_EVERYTHING=1 "$t" --test-threads 2 || status=1
    done
    echo "== exit $status"
    exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
EOF
    chmod +x "$out/run.sh"
    du -sh "$out"
    ;;
*)
    echo "usage: scripts/device-tests.sh build   (then run target/device/run.sh on the device)" >&2
    exit 2
    ;;
esac
