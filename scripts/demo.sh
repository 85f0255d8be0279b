#!/usr/bin/env bash
# README command 1: installs what is missing, builds the release preset and runs the main demo
# (a real model writes a scene under several KV policies side by side; each row suspends its
# cache to a snapshot, resumes it in a new process and checks the continuation is identical).
# Arguments go to kvsdk-demo. The build is quiet when it succeeds; when it fails, its output is
# shown.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
log=$(mktemp "${TMPDIR:-/tmp}/kvsdk-demo-build.XXXXXX")
trap 'rm -f "$log"' EXIT
echo "demo.sh: building the release preset (cmake --workflow --preset release; minutes on a first run)" >&2
if ! cmake --workflow --preset release >"$log" 2>&1; then
  echo "demo.sh: the build failed; its output follows" >&2
  cat "$log" >&2
  exit 1
fi
./build/release/samples/demo/kvsdk-demo "$@"
