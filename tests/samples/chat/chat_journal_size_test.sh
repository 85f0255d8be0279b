#!/usr/bin/env bash
# A 20-turn kvsdk-chat conversation under compressed policies stays a small file: with the chat's
# default compaction (--journal-percent 50) its autosaved journal leaves a file at most 1.5x a
# fresh full save of the same cache (written by `kvsdk recompress` under the same policy, which
# loads the conversation and saves it whole). Without compaction journals of compressed caches
# used to grow with the square of the conversation.
set -euo pipefail
chat="$1"
cli="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../../support/emulator.sh"
chat="$(emulated "$chat" "$work")"
cli="$(emulated "$cli" "$work")"
turns() { for i in $(seq 1 20); do echo "Speak."; done; }
# kivi never evicts; xkv+kivi2 under a budget evicts on most turns once the budget is reached.
for spec in "kivi" "xkv+kivi2 --budget 25%"; do
  read -r policy budget_flag budget <<<"$spec"
  name="${policy//+/_}"
  turns | "$chat" --model shakespeare-small --temperature 0 --reply-tokens 8 \
    --policy "$policy" ${budget_flag:+"$budget_flag" "$budget"} \
    --session "$work/$name.kvsnap" >"$work/$name.txt" 2>"$work/$name.err" ||
    { echo "FAIL: kvsdk-chat $policy"; cat "$work/$name.err"; exit 1; }
  saved=$(grep -c '^\[turn [0-9]* saved' "$work/$name.err" || true)
  [ "$saved" -eq 20 ] || { echo "FAIL: $policy saved $saved turns, not 20"; cat "$work/$name.err"; exit 1; }
  "$cli" recompress "$work/$name.kvsnap" "$work/$name.fresh" --policy "$policy" --budget 1G \
    >"$work/$name.cli" 2>&1 || { echo "FAIL: kvsdk recompress $policy"; cat "$work/$name.cli"; exit 1; }
  journaled=$(stat -c %s "$work/$name.kvsnap")
  fresh=$(stat -c %s "$work/$name.fresh")
  echo "$policy: 20-turn file $journaled bytes, fresh full save $fresh bytes"
  awk -v j="$journaled" -v f="$fresh" 'BEGIN { exit !(j <= 1.5 * f) }' ||
    { echo "FAIL: $policy: the journal file is over 1.5x a fresh full save"; exit 1; }
done
echo "chat journal sizes passed"
