#!/usr/bin/env bash
# Run a statically linked x86-64 Linux binary on an emulated AVX-512 CPU.
#
# The host (AMD Zen 3) has no AVX-512, so this boots a tiny Linux under the
# Bochs 2.7 x86 emulator from Debian (CPU model "tigerlake": AVX-512
# F/CD/BW/DQ/VL/VNNI/IFMA/VBMI/VBMI2/BITALG/VPOPCNTDQ, no BF16/FP16), runs the
# binary as the only program in an initramfs, and exits with its exit code.
#
# Usage:
#   scripts/avx512-emulator.sh [--cpu MODEL] [--timeout SECS] [--memory MB]
#                              [--env K=V]... [--verbose] -- BINARY [ARGS...]
#
# Everything comes from Debian packages fetched with `apt-get download` and
# unpacked (dpkg-deb) into a cache directory, nothing is installed system-wide:
#   ${INT4_EMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/int4/emulator}
# Exit status: the binary's, 124 on timeout, 125 on an emulator/setup failure.
# Bochs is an interpreter: booting takes ~3-5 minutes (mostly the kernel's own
# XZ decompression) and code runs at ~20-30 MIPS, some 300x slower than
# native, so keep test shapes small. INT4_EMU_KEEP=1 keeps the work directory
# (bochsrc, serial and bochs logs) for debugging.
set -euo pipefail

CPU=tigerlake TIMEOUT=1800 MEMORY=1024 VERBOSE=0 ENVS=()
CACHE=${INT4_EMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/int4/emulator}

die() { echo "avx512-emulator: error: $*" >&2; exit 125; }
say() { echo "avx512-emulator: $*" >&2; }
usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 125; }

while (($#)); do
  case $1 in
    --cpu) CPU=${2:?}; shift 2 ;;
    --timeout) TIMEOUT=${2:?}; shift 2 ;;
    --memory) MEMORY=${2:?}; shift 2 ;;
    --env) [[ ${2:-} == *=* ]] || die "--env needs K=V"; ENVS+=("$2"); shift 2 ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option '$1' (binary goes after --)" ;;
  esac
done
(($#)) || usage
BIN=$(readlink -f "$1") || die "no such binary: $1"; shift
[[ -f $BIN && -x $BIN ]] || die "not an executable file: $BIN"
# The guest has no libc or loader: refuse ELF files with a PT_INTERP header.
[[ $(head -c 4 "$BIN" | od -An -c | tr -d ' ') == 177ELF ]] || die "not an ELF file: $BIN"
read -r phoff < <(od -An -t u8 -j 32 -N 8 "$BIN")
read -r phentsize phnum < <(od -An -t u2 -j 54 -N 4 "$BIN")
for ((i = 0; i < phnum; i++)); do
  (($(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 "$BIN") == 3)) &&
    die "$BIN is dynamically linked; build with RUSTFLAGS='-C target-feature=+crt-static'"
done

# ---------------------------------------------------------------- toolchain --
# $ROOT is one merged tree of unpacked .debs; .ready marks a finished fetch so
# later runs never touch the network.
ROOT=$CACHE/root
fetch_tools() {
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || die "needs a Debian host (apt-get, dpkg-deb)"
  # apt-cache answers nothing on a machine that never ran apt-get update.
  apt-cache show bochs >/dev/null 2>&1 || apt-get update -qq \
    || die "apt-get update failed (root needed on a fresh machine)"
  local kernel libs pkgs debs
  # The kernel the linux-image-amd64 metapackage currently points at.
  kernel=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  [[ -n $kernel ]] || die "cannot resolve linux-image-amd64"
  # bochs-bin links GTK etc.; fetch only the shared libraries this host lacks
  # (apt's simulated install lists them) and point LD_LIBRARY_PATH at them.
  libs=$(apt-cache depends --no-recommends --no-suggests bochs | awk '/Depends: lib/{print $2}')
  pkgs=$(apt-get install -s --no-install-recommends $libs | awk '/^Inst /{print $2}')
  debs=$(mktemp -d "${TMPDIR:-/tmp}/avx512-emu-debs.XXXXXX")
  say "downloading bochs, $kernel and helpers into $CACHE (first run only)"
  (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root \
      bochs bochsbios vgabios busybox-static syslinux syslinux-common mtools \
      dosfstools "$kernel" $pkgs >&2) || die "apt-get download failed"
  rm -rf "$ROOT.tmp"; mkdir -p "$ROOT.tmp"
  local d
  for d in "$debs"/*.deb; do
    if [[ $d == */linux-image-* ]]; then  # only the bzImage, not 400 MB of modules
      dpkg-deb --fsys-tarfile "$d" | tar -x -C "$ROOT.tmp" --wildcards './boot/vmlinuz-*'
    else
      dpkg-deb -x "$d" "$ROOT.tmp"
    fi
  done
  rm -rf "$debs" "$ROOT"; mv "$ROOT.tmp" "$ROOT"; touch "$ROOT/.ready"
}
[[ -e $ROOT/.ready ]] || fetch_tools
KERNEL=$(ls "$ROOT"/boot/vmlinuz-* | head -n1)
export PATH="$ROOT/usr/bin:$ROOT/sbin:$ROOT/bin:$PATH" MTOOLS_SKIP_CHECK=1
export LD_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LTDL_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu/bochs/plugins" BXSHARE="$ROOT/usr/share/bochs"
BUSYBOX=$ROOT/bin/busybox
command -v script >/dev/null || die "needs script(1) from bsdutils/util-linux"

# ---------------------------------------------------------------- initramfs --
WORK=$(mktemp -d "${TMPDIR:-/tmp}/avx512-emu.XXXXXX")
cleanup() {
  if [[ -s $WORK/bochs.pid ]]; then kill "$(cat "$WORK/bochs.pid")" 2>/dev/null || true; fi
  if [[ -n ${INT4_EMU_KEEP:-} ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }  # single-quote a word for sh
mkdir -p "$WORK"/initrd/{bin,dev,proc,sys,tmp,test}
cp "$BUSYBOX" "$WORK/initrd/bin/busybox"
cp "$BIN" "$WORK/initrd/test/"
{
  echo '#!/bin/busybox sh'
  echo '/bin/busybox --install -s /bin; export PATH=/bin'
  echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
  echo 'echo "INT4-EMU-CPU $(grep -m1 "^model name" /proc/cpuinfo)"'
  echo 'echo "INT4-EMU-FLAGS $(grep -m1 "^flags" /proc/cpuinfo | tr " " "\n" | grep -E "avx512|vnni|bf16" | tr "\n" " ")"'
  echo 'export HOME=/tmp RUST_TEST_THREADS=1 RUST_BACKTRACE=1'
  for e in "${ENVS[@]}"; do echo "export $(q "$e")"; done
  printf 'cd /tmp; echo INT4-EMU-START; /test/%s' "$(q "${BIN##*/}")"
  for a in "$@"; do printf ' %s' "$(q "$a")"; done
  echo ' </dev/null; rc=$?'
  # stty's tcsetattr(TCSADRAIN) waits until the UART has sent everything;
  # poweroff -f alone would cut off the tail of the output.
  echo 'echo; echo "INT4-EMU-EXIT $rc"; stty -echo; poweroff -f'
} > "$WORK/initrd/init"
chmod +x "$WORK/initrd/init"
(cd "$WORK/initrd" && find . | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null | gzip -1) > "$WORK/initrd.gz"

# ------------------------------------------------------------- boot disk -----
# Bochs cannot load a kernel directly, so: a partitionless FAT "superfloppy"
# with SYSLINUX (installed through mtools: no loop mount) that loads both.
# Kernel parameters work around Bochs 2.7 CPUID bugs with the tigerlake and
# icelake models (Linux 6.1 boots cleanly on neither without them):
#  - XSAVE leaf 0xD reports PKRU with size 0 and a wrong compacted size, so
#    Linux disables XSAVE entirely (no AVX at all): clear pku/ospke (515,516)
#    and xsavec/xsaves (321,323) so it uses the plain "standard" layout;
#  - with fsrm (580) the kernel's rep-movsb memcpy/memmove paths go wrong under
#    Bochs and the boot dies right after "LSM: Security Framework
#    initializing" (exception handlers overwritten); clearing it avoids that.
# clearcpuid only changes what the kernel uses; user space still executes
# CPUID itself and sees every AVX-512 bit of the model.
cat > "$WORK/syslinux.cfg" <<EOF
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL vmlinuz
  INITRD initrd.gz
  APPEND console=ttyS0,115200 rdinit=/init panic=-1 mitigations=off clearcpuid=515,516,321,323,580 $( ((VERBOSE)) || echo quiet)
EOF
# Size in whole 16-head/63-sector cylinders so Bochs accepts the geometry.
need=$(( ($(stat -c %s "$KERNEL") + $(stat -c %s "$WORK/initrd.gz")) / 1024 + 4096 ))
cyls=$(( need / 504 + 1 ))
truncate -s $((cyls * 16 * 63 * 512)) "$WORK/disk.img"
mkfs.fat -g 16/63 -h 0 "$WORK/disk.img" >/dev/null
syslinux --install "$WORK/disk.img"
mcopy -i "$WORK/disk.img" "$KERNEL" ::vmlinuz
mcopy -i "$WORK/disk.img" "$WORK/initrd.gz" "$WORK/syslinux.cfg" ::

# ------------------------------------------------------------------ bochs ----
# Debian's bochs has no "nogui" library; "rfb" (a VNC server on a port in
# 5900-5949, for the few seconds it runs) with timeout=0 runs headless.
# com1 is the controlling tty that script(1) gives bochs below: "term" mode
# write()s each byte at once, whereas "file" mode sits in a stdio buffer and a
# regular file in "term" mode floods the guest with NUL input.
cat > "$WORK/bochsrc" <<EOF
megs: $MEMORY
cpu: model=$CPU, count=1, ips=100000000, reset_on_triple_fault=0
clock: sync=none, time0=local
romimage: file=$BXSHARE/BIOS-bochs-latest
vgaromimage: file=$ROOT/usr/share/vgabios/vgabios.bin
display_library: rfb, options="timeout=0"
ata0-master: type=disk, path=$WORK/disk.img, mode=flat, cylinders=$cyls, heads=16, spt=63
boot: disk
speaker: enabled=0
sound: driver=dummy
com1: enabled=1, mode=term, dev=/dev/tty
log: $WORK/bochs.log
panic: action=fatal
error: action=report
info: action=ignore
debug: action=ignore
EOF
echo c > "$WORK/debugger.rc"  # Debian builds the debugger in: just "continue"
mkfifo "$WORK/stdin"          # opened read-write: script(1) never sees EOF
: > "$WORK/serial.log"
START=$SECONDS
SHELL=/bin/sh script -qfec "echo \$\$ > '$WORK/bochs.pid'; exec bochs-bin -q -f '$WORK/bochsrc' \
  -rc '$WORK/debugger.rc' >'$WORK/bochs.out' 2>&1" "$WORK/serial.log" 0<>"$WORK/stdin" >/dev/null 2>&1 &
SCRIPT_PID=$!
say "booting $CPU under bochs (timeout ${TIMEOUT}s)"

# Stream the serial log (minus script(1)'s header line) up to the sentinel
# line that the init script prints; note when the binary starts.
off=0 booted= rc=
while :; do
  alive=1; kill -0 "$SCRIPT_PID" 2>/dev/null || alive=0  # before the last read
  size=$(stat -c %s "$WORK/serial.log")
  if ((off == 0)) && head -n1 "$WORK/serial.log" | grep -q '^Script started'; then
    off=$(head -n1 "$WORK/serial.log" | wc -c)
  fi
  if ((size > off)); then
    exit_at=$(grep -abo '^INT4-EMU-EXIT [0-9]*' "$WORK/serial.log" | head -n1) || true
    if [[ -n $exit_at ]]; then  # "BYTE_OFFSET:INT4-EMU-EXIT RC": stop after it
      match=${exit_at#*:}; rc=${match##* }; size=$((${exit_at%%:*} + ${#match}))
    fi
    # tail may outrun head and die of SIGPIPE: not an error.
    tail -c +$((off + 1)) "$WORK/serial.log" | head -c $((size - off)) | tr -d '\r' || true
    off=$size
    [[ -n $rc ]] && echo  # the sentinel line was cut before its newline
    if [[ -z $booted ]] && grep -aq '^INT4-EMU-START' "$WORK/serial.log"; then
      booted=$((SECONDS - START)); say "booted in ${booted}s"
    fi
    [[ -n $rc ]] && break
  fi
  if ((!alive)); then
    say "bochs exited before the binary finished; last log lines:"
    tail -n 20 "$WORK/bochs.out" "$WORK/bochs.log" >&2 || true
    exit 125
  fi
  if ((SECONDS - START >= TIMEOUT)); then
    say "TIMEOUT after ${TIMEOUT}s (booted: ${booted:-no}); killing bochs"
    exit 124
  fi
  sleep 1
done
say "binary exited with $rc after $((SECONDS - START - ${booted:-0}))s (total $((SECONDS - START))s)"
exit "$rc"
