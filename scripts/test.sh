#!/usr/bin/env bash
# README command 2: installs what is missing, builds the dev preset and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --workflow --preset dev
