#!/usr/bin/env bash
# kvsdk CLI: verify exits 0 on sound snapshots and 1 (never a signal) on every damaged variant;
# inspect/verify --json output parses; recompress applies implemented policies and explains what
# is missing.
# usage: cli_test.sh KVSDK_BINARY GOLDEN_DIR
set -uo pipefail
cli=$1
golden=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../../support/emulator.sh"
cli=$(emulated "$cli" "$tmp")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_exit CODE CMD...: runs CMD, checks its exit code (and that no signal ended it).
expect_exit() {
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" -ge 128 ]; then fail "$* died with signal $((got - 128))"; return; fi
  [ "$got" -eq "$want" ] || fail "$* exited $got, expected $want: $(cat "$tmp/err")"
}

json_ok() { python3 -m json.tool "$tmp/out" >/dev/null || fail "$* output is not JSON: $(cat "$tmp/out")"; }

good=$golden/v1_0_journal_bf16.kvsnap
for f in "$golden"/v1_0_exact_f32.kvsnap "$golden"/v1_0_multiframe_f16.kvsnap "$good"; do
  expect_exit 0 "$cli" verify "$f"
  expect_exit 0 "$cli" inspect "$f"
  grep -q "n_kv_heads" "$tmp/out" || fail "inspect $f lacks the geometry"
  expect_exit 0 "$cli" inspect "$f" --json; json_ok inspect "$f"
  expect_exit 0 "$cli" verify "$f" --json; json_ok verify "$f"
done
python3 - "$tmp/out" <<'PY' || fail "verify --json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True and d["journal_frames_applied"] == 2, d
PY
"$cli" inspect "$good" --json >"$tmp/inspect.json"
python3 - "$tmp/inspect.json" <<'PY' || fail "inspect --json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["geometry"]["n_layers"] == 2 and d["policy"]["method"] == "full", d
assert [l["tokens"] for l in d["layers"]] == [7 + 5, 8 + 9], d["layers"]
assert d["totals"]["logical_fp16_bytes"] == (12 + 17) * 8 * 4, d["totals"]
PY

# The 3.x and 4.0 writers' golden files (a base and two journal deltas each) verify and inspect,
# and report the version in their container header; a flipped byte in the base of each is refused.
for f in "$golden"/v3_0_*.kvsnap "$golden"/v3_1_*.kvsnap "$golden"/v4_0_*.kvsnap \
         "$golden"/v1_2_*.kvsnap; do
  want=3.0
  case $(basename "$f") in v1_2_*) want=1.2 ;; v3_1_*) want=3.1 ;; v4_0_*) want=4.0 ;; esac
  expect_exit 0 "$cli" verify "$f"
  expect_exit 0 "$cli" inspect "$f" --json; json_ok inspect "$f"
  python3 - "$tmp/out" "$want" <<'PY' || fail "inspect --json of $f: format"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == sys.argv[2], d["format"]
PY
  cp "$f" "$tmp/flip3.kvsnap"
  printf '\x5a' | dd of="$tmp/flip3.kvsnap" bs=1 seek=100 conv=notrunc status=none
  cmp -s "$f" "$tmp/flip3.kvsnap" || expect_exit 1 "$cli" verify "$tmp/flip3.kvsnap"
done

# Torn journal tail: loads, but verify says it is not sound.
expect_exit 1 "$cli" verify "$golden/v1_0_torn_tail.kvsnap"
expect_exit 1 "$cli" verify "$golden/v1_0_torn_tail.kvsnap" --json; json_ok verify torn

# Damaged variants of the base part of a snapshot: truncations and byte flips everywhere.
base=$golden/v1_0_multiframe_f16.kvsnap
size=$(stat -c %s "$base")
for cut in 0 1 8 31 32 33 100 $((size / 2)) $((size - 33)) $((size - 1)); do
  head -c "$cut" "$base" >"$tmp/cut.kvsnap"
  expect_exit 1 "$cli" verify "$tmp/cut.kvsnap"
done
for off in 0 9 20 40 70 $((size / 3)) $((size / 2)) $((size - 40)) $((size - 20)) $((size - 1)); do
  cp "$base" "$tmp/flip.kvsnap"
  printf '\x5a' | dd of="$tmp/flip.kvsnap" bs=1 seek="$off" conv=notrunc status=none
  cmp -s "$base" "$tmp/flip.kvsnap" || { expect_exit 1 "$cli" verify "$tmp/flip.kvsnap"; \
    expect_exit 1 "$cli" verify "$tmp/flip.kvsnap" --json; json_ok verify flip "$off"; }
done
expect_exit 1 "$cli" verify "$tmp/does-not-exist"
expect_exit 1 "$cli" inspect "$tmp/does-not-exist" --json; json_ok inspect missing

# recompress: 'full' re-saves under a budget; another implemented policy re-appends the rows and
# compresses them to the budget; too small a budget and unimplemented methods fail.
expect_exit 0 "$cli" recompress "$good" "$tmp/re.kvsnap" --policy full --budget 1M
expect_exit 0 "$cli" verify "$tmp/re.kvsnap"
expect_exit 1 "$cli" recompress "$good" "$tmp/re2.kvsnap" --policy full --budget 100
grep -q "budget" "$tmp/err" || fail "budget failure not explained: $(cat "$tmp/err")"
same_heads=$golden/v1_0_multiframe_f16.kvsnap  # every KV head holds the same tokens
for policy in streaming_llm snapkv xkv; do
  expect_exit 0 "$cli" recompress "$same_heads" "$tmp/re_$policy.kvsnap" --policy "$policy" \
    --budget 2K
  expect_exit 0 "$cli" verify "$tmp/re_$policy.kvsnap"
  expect_exit 0 "$cli" inspect "$tmp/re_$policy.kvsnap" --json; json_ok inspect "$policy"
  grep -q "\"$policy\"" "$tmp/out" || fail "recompressed file does not carry policy $policy"
  [ "$(stat -c %s "$tmp/re_$policy.kvsnap")" -lt "$(stat -c %s "$same_heads")" ] ||
    fail "recompress to $policy did not shrink the snapshot"
done
# Compressed tiers: into kivi (format 2), and from kivi on to an eviction preset.
expect_exit 0 "$cli" recompress "$same_heads" "$tmp/re_kivi.kvsnap" --policy kivi --budget 1M
expect_exit 0 "$cli" verify "$tmp/re_kivi.kvsnap"
expect_exit 0 "$cli" inspect "$tmp/re_kivi.kvsnap" --json; json_ok inspect kivi
grep -q '"kivi"' "$tmp/out" || fail "recompressed file does not carry policy kivi"
[ "$(stat -c %s "$tmp/re_kivi.kvsnap")" -lt "$(stat -c %s "$same_heads")" ] ||
  fail "recompress to kivi did not shrink the snapshot"
expect_exit 0 "$cli" recompress "$tmp/re_kivi.kvsnap" "$tmp/re_kivi_snapkv.kvsnap" --policy snapkv \
  --budget 2K
expect_exit 0 "$cli" verify "$tmp/re_kivi_snapkv.kvsnap"
# A cache that keeps the same tokens in every KV head can change policy again.
expect_exit 0 "$cli" recompress "$tmp/re_streaming_llm.kvsnap" "$tmp/re_back.kvsnap" --policy full \
  --budget 1M
# Rows evicted per KV head cannot be re-appended through the C API: a clear status.
expect_exit 1 "$cli" recompress "$good" "$tmp/re4.kvsnap" --policy streaming_llm --budget 1M
grep -q "per KV head" "$tmp/err" || fail "per-head source not explained: $(cat "$tmp/err")"
expect_exit 1 "$cli" recompress "$good" "$tmp/re3.kvsnap" --policy smallkv --budget 1M
grep -Eq "not implemented|not supported" "$tmp/err" || fail "unsupported policy not explained: $(cat "$tmp/err")"
expect_exit 1 "$cli" recompress "$good" "$tmp/re3.kvsnap" --policy smallkv --budget 1M --json
json_ok recompress smallkv
grep -q "KVSDK_E_UNSUPPORTED" "$tmp/out" || fail "json lacks the status"
[ ! -e "$tmp/re2.kvsnap" ] && [ ! -e "$tmp/re3.kvsnap" ] && [ ! -e "$tmp/re4.kvsnap" ] || fail "failed recompress wrote output"

# Usage errors.
expect_exit 2 "$cli"
expect_exit 2 "$cli" frobnicate x
expect_exit 2 "$cli" recompress a b --policy full
expect_exit 2 "$cli" recompress a b --policy full --budget lots
expect_exit 2 "$cli" verify a --bogus

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "cli tests passed"
