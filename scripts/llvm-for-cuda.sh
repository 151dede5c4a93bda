#!/usr/bin/env bash
# Installs the LLVM 23.1 that Burn's CUDA backend links (through cubecl-llvm), from PyPI instead
# of GitHub, so that `cargo build --release --features cuda` works where only the package
# registries are reachable. With full network access it is not needed: the build downloads
# Tracel's own LLVM bundle by itself.
#
#   scripts/llvm-for-cuda.sh            # once; then: cargo build --release --features cuda
#
# What it does: installs the wheels mlc-llvm-static and mlc-llvm-static-extra-targets
# 23.1.1.post0 (static LLVM libraries, headers and llvm-config; NVPTX is in the second; hashes
# pinned below) into the directory the build looks in,
# ${XDG_DATA_HOME:-~/.local/share}/tracel/tracel-llvm-23.1.0-4, and writes the marker file that
# tells the build LLVM is there. Needs Python >= 3.10 with pip, and the C libraries LLVM links
# (Debian: zlib1g-dev libzstd-dev; installed here when run as root with apt-get).
#
# PYTHON: the Python to run pip with (default python3).
# Run again after a failed or partial install: it starts over. If a build ran before the
# install, run `cargo clean -p cubecl-llvm -p tracel-llvm-bundler` once.
set -euo pipefail

version="23.1.1.post0"
bundle="tracel-llvm-23.1.0-4" # what tracel-llvm-bundler 23.1.0-4 (cubecl-llvm 0.11.3) looks for
python="${PYTHON:-python3}"
dest="${XDG_DATA_HOME:-$HOME/.local/share}/tracel/$bundle"
marker="$dest/.tracel-llvm-installed"

say() { echo "llvm-for-cuda: $*"; }
die() { echo "llvm-for-cuda: error: $*" >&2; exit 1; }

if [ -f "$marker" ] && "$dest/bin/llvm-config" --version 2>/dev/null | grep -q '^23\.1\.'; then
  say "LLVM $("$dest/bin/llvm-config" --version) is installed in $dest"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-aarch64) ;;
  *) die "the LLVM wheels exist for Linux on x86_64 and aarch64 only; elsewhere build with network access (the build downloads LLVM itself)" ;;
esac

# The C libraries LLVM's static libraries link against.
missing=()
for lib in z zstd; do
  printf 'int main(void){return 0;}' | cc -x c - -o /dev/null "-l$lib" 2>/dev/null || missing+=("$lib")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing zlib1g-dev libzstd-dev"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends zlib1g-dev libzstd-dev >/dev/null
  else
    die "LLVM links against zlib and zstd: install their development files (Debian/Ubuntu: sudo apt-get install zlib1g-dev libzstd-dev) and run this again"
  fi
fi

"$python" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
  || die "needs Python 3.10 or newer with pip (set PYTHON=/path/to/python3)"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip (set PYTHON=/path/to/python3)"

# A fresh directory beside the final one, renamed into place only once complete.
parent="$(dirname "$dest")"
mkdir -p "$parent"
staging="$(mktemp -d "$parent/.$bundle.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
requirements="$staging/requirements.txt"
cat > "$requirements" <<EOF
mlc-llvm-static==$version \\
  --hash=sha256:dcfec888abfaa418be77d41af585805f31463584cf9c90582992c00f392c1ac5 \\
  --hash=sha256:3d4b1b30cea531ffa5956fa14ff4ffb0b1ed61284bf31eac3ebb752fb308b71d
mlc-llvm-static-extra-targets==$version \\
  --hash=sha256:c36e834d9a4e9cf9759f27fece65711ece7a2fc2b5a96dbb15d66f5e9e787929 \\
  --hash=sha256:b1ddc694cf75bb1502b64c1898b15915362450453b637534886519e20e3d5522
EOF
say "installing LLVM $version from PyPI (about 90 MB) into $dest"
"$python" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes -r "$requirements" --target "$staging/sdk" \
  || die "pip could not install the LLVM wheels (is PyPI reachable?)"
rm "$requirements"
static="sdk/mlc_llvm_static/static"
for part in bin include lib share; do
  [ -e "$staging/$static/$part" ] || die "the wheel has no $static/$part"
  ln -s "$static/$part" "$staging/$part"
done
"$staging/bin/llvm-config" --targets-built | grep -qw NVPTX || die "this LLVM has no NVPTX target"
touch "$staging/.tracel-llvm-installed"

rm -rf "$dest"
mv "$staging" "$dest"
trap - EXIT
say "LLVM $("$dest/bin/llvm-config" --version) with NVPTX is installed in $dest"
say "now: cargo build --release --features cuda"
