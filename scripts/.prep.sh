#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust. Installs what the tests
# need when it is missing: redis-server and redis-tools (the tests start real Redis
# servers on ephemeral ports), procps (its kill, to pause and kill them), Node.js and Python's venv (the official OpenAI and
# Anthropic SDK tests, Codex CLI, Claude Code), Chromium (the dashboard test),
# docker-compose (to validate docker-compose.yml; no Docker engine is needed or used).
# Into target/, reused by later runs: the openai and anthropic SDKs, playwright-core,
# Codex CLI and Claude Code (target/sdk/), nginx's binary when nginx is not installed
# (target/nginx/), and a real local provider, llama.cpp's llama-server and a small model
# (scripts/setup-llama, target/llama/; it installs cmake, make, g++ and curl when
# missing; the first build takes about 8 minutes). It validates the deployment files
# first (docker-compose.yml with docker-compose's own parser, deploy/nginx.conf with
# nginx -t), then runs every test target, then the tests that need what was installed
# (SDK, Codex CLI, Claude Code, llama-server and dashboard tests, which a bare `cargo
# test` skips) and the fault suite against the release binary (built here), printing
# what it measured, and 20 s of fuzzing per parser of untrusted bytes (scripts/fuzz; it
# installs g++). The documentation is built and checked first (scripts/check-docs:
# links, anchors, code blocks; it installs mdBook into target/sdk/mdbook/), and the
# house rules of src/ (scripts/check-house: no function over 80 lines, no import cycle).
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

PYTHON_OPENAI=3.57.0
PYTHON_ANTHROPIC=2.15.0
NODE_OPENAI=6.49.0
PLAYWRIGHT=1.64.1
CODEX=0.171.0
CLAUDE_CODE=2.1.332

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# The kill binary (not the shell's builtin): the tests signal Redis servers (pause,
# resume, kill) and abridge's own process with it. Minimal images lack procps.
type -P kill >/dev/null 2>&1 || missing+=(procps)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# Headless Chromium for the dashboard test (the browser, not a download by a test tool).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)

apt_install_missing scripts/test "${missing[@]}"
# The openai Node SDK and playwright-core need Node.js 20 or newer; Debian 12's own
# nodejs is 18. Say so rather than let their tests fail obscurely.
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "scripts/test: Node.js $(node -v) is too old: the openai Node SDK $NODE_OPENAI and" \
    "playwright-core $PLAYWRIGHT need Node.js 20 or newer (e.g. Debian 13's nodejs)." >&2
  exit 1
fi

# The deployment files, checked by the tools that read them (well under a second).
docker-compose -f docker-compose.yml config -q
nginx=$(scripts/nginx-binary)
# The replicas' names resolve only inside compose, so the check runs on a copy that
# names a loopback address instead, with every path nginx writes in a temporary
# directory (the configuration under test is otherwise unchanged).
nginx_dir=$(mktemp -d)
trap 'rm -rf "$nginx_dir"' EXIT
sed -E -e 's/server abridge-[0-9]+:8080/server 127.0.0.1:8080/' \
  -e "s|^http \{|http {\n    access_log off; client_body_temp_path $nginx_dir/body; proxy_temp_path $nginx_dir/proxy; fastcgi_temp_path $nginx_dir/fastcgi; uwsgi_temp_path $nginx_dir/uwsgi; scgi_temp_path $nginx_dir/scgi;|" \
  deploy/nginx.conf >"$nginx_dir/nginx.conf"
"$nginx" -t -q -p "$nginx_dir/" -e stderr -g "pid $nginx_dir/nginx.pid;" -c "$nginx_dir/nginx.conf"

# The book (docs/) builds without a warning, and its links and code blocks are sound.
scripts/check-docs
# The house rules the compiler does not check: function and file length, import cycles.
scripts/check-house

sdk=target/sdk
if ! "$sdk/venv/bin/python" -c "import openai, anthropic, sys; sys.exit(openai.__version__ != '$PYTHON_OPENAI' or anthropic.__version__ != '$PYTHON_ANTHROPIC')" >/dev/null 2>&1; then
  echo "scripts/test: installing the openai $PYTHON_OPENAI and anthropic $PYTHON_ANTHROPIC Python SDKs into $sdk/venv" >&2
  rm -rf "$sdk/venv"
  python3 -m venv "$sdk/venv"
  "$sdk/venv/bin/pip" install -q --disable-pip-version-check "openai==$PYTHON_OPENAI" "anthropic==$PYTHON_ANTHROPIC"
fi
if ! grep -q "\"version\": \"$NODE_OPENAI\"" "$sdk/node/node_modules/openai/package.json" 2>/dev/null \
  || ! grep -q "\"version\": \"$PLAYWRIGHT\"" "$sdk/node/node_modules/playwright-core/package.json" 2>/dev/null; then
  echo "scripts/test: installing the openai Node SDK $NODE_OPENAI and playwright-core $PLAYWRIGHT into $sdk/node" >&2
  mkdir -p "$sdk/node"
  npm install --silent --no-audit --no-fund --prefix "$sdk/node" "openai@$NODE_OPENAI" "playwright-core@$PLAYWRIGHT"
fi

# Codex CLI (its native binary ships inside the npm package) for the Codex tests
# (tests/it/codex.rs, codex_remote.rs; run with the other ignored tests below).
if ! grep -q "\"version\": \"$CODEX\"" "$sdk/codex/node_modules/@openai/codex/package.json" 2>/dev/null; then
  echo "scripts/test: installing Codex CLI $CODEX into $sdk/codex" >&2
  mkdir -p "$sdk/codex"
  npm install --silent --no-audit --no-fund --prefix "$sdk/codex" "@openai/codex@$CODEX"
fi

# Claude Code (its native binary ships inside the npm package) for the Claude Code test.
if ! grep -q "\"version\": \"$CLAUDE_CODE\"" "$sdk/claude/node_modules/@anthropic-ai/claude-code/package.json" 2>/dev/null; then
  echo "scripts/test: installing Claude Code $CLAUDE_CODE into $sdk/claude" >&2
  mkdir -p "$sdk/claude"
  npm install --silent --no-audit --no-fund --prefix "$sdk/claude" "@anthropic-ai/claude-code@$CLAUDE_CODE"
fi

scripts/setup-llama >/dev/null

