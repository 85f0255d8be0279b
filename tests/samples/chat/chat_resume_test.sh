#!/usr/bin/env bash
# kvsdk-chat autosave + --resume: three greedy turns in one process must give the same third
# reply as two turns, a process exit, and the third turn in a process resumed from the journal.
set -euo pipefail
chat="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../../support/emulator.sh"
chat="$(emulated "$chat" "$work")"
# Every turn stays a journal delta here (0: the journal is never folded into a full save), which
# the checks below rely on.
args=(--model shakespeare-small --temperature 0 --reply-tokens 40 --journal-percent 0)
printf 'Good morrow, cousin.\nWhat news?\nThen farewell.\n' |
  "$chat" "${args[@]}" --session "$work/one.kvsnap" >"$work/one.txt" 2>"$work/one.err"
printf 'Good morrow, cousin.\nWhat news?\n' |
  "$chat" "${args[@]}" --session "$work/two.kvsnap" >"$work/two.txt" 2>"$work/two.err"
printf 'Then farewell.\n' |
  "$chat" "${args[@]}" --resume "$work/two.kvsnap" >"$work/three.txt" 2>"$work/three.err"
cat "$work/three.err"
grep -q "1 journal turns applied" "$work/three.err" || { echo "FAIL: turn 2 was not a journal delta"; exit 1; }
grep -q "resumed" "$work/three.err" || { echo "FAIL: no resume"; exit 1; }
# The reply to the third turn: everything after the third "JULIET:" line of the single run.
expected="$(awk '/^JULIET:$/{n++} n==3' "$work/one.txt")"
got="$(cat "$work/three.txt")"
[ "$(printf "%s\n" "$got" | wc -l)" -ge 2 ] || { echo "FAIL: empty reply"; exit 1; }
if [ "$expected" != "$got" ]; then
  echo "FAIL: resumed reply differs"; echo "--- expected"; echo "$expected"; echo "--- got"; echo "$got"
  exit 1
fi
# Turn numbers go on across the resume: the resumed process saves turn 3, not turn 1.
grep -q "^\[turn 2 saved" "$work/two.err" || { echo "FAIL: first process did not save turn 2"; exit 1; }
grep -q "2 turns, " "$work/three.err" || { echo "FAIL: resume did not count 2 turns"; exit 1; }
grep -q "^\[turn 3 saved" "$work/three.err" || { echo "FAIL: resumed turn is not numbered 3"; exit 1; }
grep -q "^\[turn 1 saved" "$work/three.err" && { echo "FAIL: resumed numbering restarted at 1"; exit 1; }
[ "$(wc -l <"$work/two.kvsnap.turns")" -eq 3 ] || { echo "FAIL: turn record has not 3 turns"; exit 1; }
# A crash between a turn's autosave and its turn record: the snapshot holds a turn the record
# lacks (here the third of three), and that turn still counts, so the next one is turn 4.
cp "$work/one.kvsnap" "$work/crash.kvsnap"
head -n 2 "$work/one.kvsnap.turns" >"$work/crash.kvsnap.turns"
printf 'Adieu.\n' | "$chat" "${args[@]}" --resume "$work/crash.kvsnap" >/dev/null 2>"$work/crash.err"
grep -q "^\[turn 4 saved" "$work/crash.err" || { echo "FAIL: a turn missing from the record was lost"; cat "$work/crash.err"; exit 1; }
# Without a record the resume says that numbering restarts.
cp "$work/one.kvsnap" "$work/alone.kvsnap"
printf 'Adieu.\n' | "$chat" "${args[@]}" --resume "$work/alone.kvsnap" >/dev/null 2>"$work/alone.err"
grep -q "no turn record" "$work/alone.err" || { echo "FAIL: a missing turn record went unmentioned"; exit 1; }
# A missing or damaged session file is a clear error, not a crash.
if "$chat" "${args[@]}" --resume "$work/missing.kvsnap" </dev/null 2>"$work/err.txt"; then
  echo "FAIL: resuming a missing file succeeded"; exit 1
fi
grep -q "kvsdk_cache_load failed" "$work/err.txt" || { echo "FAIL: unclear error"; cat "$work/err.txt"; exit 1; }
head -c 100 "$work/one.kvsnap" >"$work/torn.kvsnap"
if "$chat" "${args[@]}" --resume "$work/torn.kvsnap" </dev/null 2>"$work/err.txt"; then
  echo "FAIL: resuming a truncated file succeeded"; exit 1
fi
grep -q "corrupt" "$work/err.txt" || { echo "FAIL: unclear error"; cat "$work/err.txt"; exit 1; }
echo "chat resume test: OK"
