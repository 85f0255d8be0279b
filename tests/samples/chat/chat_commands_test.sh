#!/usr/bin/env bash
# kvsdk-chat /undo, /regenerate and /fork (issue 16): a scripted conversation in one process
# gives the same text as the same script split across processes (resumed from the journal, or
# from the fork's own session file), /undo leaves exactly the conversation that never had the
# turn, and a policy that cannot truncate exactly refuses and keeps the conversation.
set -euo pipefail
chat="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../../support/emulator.sh"
chat="$(emulated "$chat" "$work")"
# Sampling (not greedy): every reply's seed comes from its start and attempt, so it must repeat.
args=(--model shakespeare-small --temperature 0.8 --reply-tokens 30 --journal-percent 0)
fail() { echo "FAIL: $*"; exit 1; }
# Reply number N (1-based) of a transcript: the lines after its N-th "JULIET:" up to the next.
reply() { awk -v n="$2" '/^JULIET:$/{k++; next} k==n' "$1"; }
same() {  # same FILE_A N_A FILE_B N_B WHAT
  local a b
  a="$(reply "$1" "$2")"; b="$(reply "$3" "$4")"
  [ -n "$a" ] || fail "$5: empty reply"
  if [ "$a" != "$b" ]; then
    echo "--- $1 #$2"; echo "$a"; echo "--- $3 #$4"; echo "$b"
    fail "$5"
  fi
}

script=$'Good morrow, cousin.\nWhat news?\n/undo\nHow now?\n/regenerate\n/fork BRANCH\nThen farewell.\n'
# 1. The whole script in one process.
printf '%s' "${script//BRANCH/$work/one-branch.kvsnap}" |
  "$chat" "${args[@]}" --session "$work/one.kvsnap" >"$work/one.txt" 2>"$work/one.err"
cat "$work/one.err"
grep -q "^\[undo: back to turn 1 saved" "$work/one.err" || fail "/undo was not journaled"
grep -q "^\[regenerated turn 2 saved" "$work/one.err" || fail "/regenerate was not journaled"
grep -q "^\[forked turn 2 to " "$work/one.err" || fail "/fork did not report"
grep -q "^\[turn 3 saved" "$work/one.err" || fail "the turn after the commands is not turn 3"
[ "$(wc -l <"$work/one.kvsnap.turns")" -eq 3 ] || fail "the turn record does not hold 3 turns"
# Five replies: turn 1, the undone turn, its replacement, the regenerated one, the last turn.
[ "$(grep -c '^JULIET:$' "$work/one.txt")" -eq 5 ] || fail "expected 5 replies"
if [ "$(reply "$work/one.txt" 3)" = "$(reply "$work/one.txt" 4)" ]; then
  fail "/regenerate sampled the same reply again"
fi

# 2. /undo is exact: the replacement turn's reply equals that of a conversation that never had
# the undone turn.
printf 'Good morrow, cousin.\nHow now?\n' |
  "$chat" "${args[@]}" --session "$work/plain.kvsnap" >"$work/plain.txt" 2>/dev/null
same "$work/plain.txt" 2 "$work/one.txt" 3 "the reply after /undo differs from one without the undone turn"

# 3. The same script split across processes: everything up to /fork, then the last turn resumed
# from the journal, and again from the fork's own session file.
printf '%s' "${script//BRANCH/$work/two-branch.kvsnap}" | sed '$d' |
  "$chat" "${args[@]}" --session "$work/two.kvsnap" >"$work/two.txt" 2>/dev/null
printf 'Then farewell.\n' |
  "$chat" "${args[@]}" --resume "$work/two.kvsnap" >"$work/resumed.txt" 2>"$work/resumed.err"
grep -q "2 turns, " "$work/resumed.err" || fail "the resume did not count 2 turns"
same "$work/one.txt" 5 "$work/resumed.txt" 1 "the resumed conversation differs"
printf 'Then farewell.\n' |
  "$chat" "${args[@]}" --resume "$work/two-branch.kvsnap" >"$work/branch.txt" 2>"$work/branch.err"
grep -q "^\[turn 3 saved to $work/two-branch.kvsnap" "$work/branch.err" || fail "the fork did not continue as turn 3"
same "$work/one.txt" 5 "$work/branch.txt" 1 "the fork's conversation differs"

# 4. /regenerate after a resume uses the record: the same new reply as in one process.
printf 'Good morrow, cousin.\nWhat news?\n' |
  "$chat" "${args[@]}" --session "$work/r.kvsnap" >/dev/null 2>&1
printf '/regenerate\n' | "$chat" "${args[@]}" --resume "$work/r.kvsnap" >"$work/r.txt" 2>/dev/null
printf 'Good morrow, cousin.\nWhat news?\n/regenerate\n' |
  "$chat" "${args[@]}" --session "$work/r1.kvsnap" >"$work/r1.txt" 2>/dev/null
same "$work/r1.txt" 3 "$work/r.txt" 1 "/regenerate after a resume differs"

# 5. A policy that cannot go back that far refuses with the library's reason and keeps the
# conversation: kivi quantizes a block of 32 tokens whenever 160 are exact, and the third turn
# (156 .. 225) saw the flush at 224.
printf 'Good morrow, cousin.\nWhat news?\nSpeak on.\n/undo\nThen farewell.\n' |
  "$chat" "${args[@]}" --reply-tokens 60 --policy kivi --session "$work/k.kvsnap" >/dev/null 2>"$work/k.err"
grep -q "/undo refused, the conversation is unchanged: kvsdk_cache_truncate failed" "$work/k.err" ||
  { cat "$work/k.err"; fail "kivi's /undo was not refused with a reason"; }
grep -q "^\[turn 4 saved" "$work/k.err" || fail "after a refused /undo the next turn is not turn 4"
echo "chat commands test: OK"
