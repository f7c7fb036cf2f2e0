#!/usr/bin/env bash
# cclz-train-local end to end on a tiny config: two runs with the same seed
# write identical loss columns (bitwise: %.9g round-trips a float), a
# different seed does not, and bad input ends with a clear message and the
# documented exit status before any step. Usage: train_local_cli.sh BINARY
set -euo pipefail
bin=$1
dir=$(mktemp -d /tmp/cclz-train-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for i in $(seq 1 60); do echo "line $i: the quick brown fox jumps over the lazy dog, $((i % 7)) times."; done > "$dir/text.txt"
args=(--data "$dir/text.txt" --layers 2 --width 32 --heads 2 --context 16 --batch 4 --steps 12 --eval-every 4 --log-every 4)

"$bin" "${args[@]}" --seed 3 --csv "$dir/a.csv" > "$dir/a.log"
"$bin" "${args[@]}" --seed 3 --csv "$dir/b.csv" > "$dir/b.log"
"$bin" "${args[@]}" --seed 4 --csv "$dir/c.csv" > /dev/null
cat "$dir/a.log"
# step, train_loss, val_loss, lr, grad_norm: everything but the timings.
cut -d, -f1-5 "$dir/a.csv" > "$dir/a.cols"
cut -d, -f1-5 "$dir/b.csv" > "$dir/b.cols"
cut -d, -f1-5 "$dir/c.csv" > "$dir/c.cols"
[[ $(wc -l < "$dir/a.cols") -eq 13 ]] || fail "want a header and 12 rows in the CSV"
head -1 "$dir/a.csv" | grep -qx 'step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,elapsed_s' || fail "CSV header"
cmp -s "$dir/a.cols" "$dir/b.cols" || { diff "$dir/a.cols" "$dir/b.cols"; fail "same seed, different losses"; }
cmp -s "$dir/a.cols" "$dir/c.cols" && fail "different seeds gave the same losses"
grep -q 'val loss' "$dir/a.log" || fail "no validation line"
grep -q 'tok/s' "$dir/a.log" || fail "no progress line"
grep -q 'ETA' "$dir/a.log" || fail "no ETA"

# expect STATUS TEXT CMD...: CMD exits with STATUS and says TEXT on stderr.
expect() {
  local want=$1 text=$2
  shift 2
  local rc=0
  "$@" > "$dir/out" 2> "$dir/err" || rc=$?
  [[ $rc -eq $want ]] || fail "$* exited $rc, want $want: $(cat "$dir/err")"
  grep -qF -- "$text" "$dir/err" || fail "$*: stderr lacks '$text': $(cat "$dir/err")"
  grep -q 'loss [0-9]' "$dir/out" && fail "$*: trained before failing"
  echo "ok: $(head -1 "$dir/err")"
}
expect 1 "'$dir/missing.txt' does not exist" "$bin" --data "$dir/missing.txt"
printf 'too short' > "$dir/short.txt"
expect 1 "too short for context 64" "$bin" --data "$dir/short.txt"
expect 2 "unknown option --frobnicate" "$bin" --frobnicate 1
expect 2 "--heads '0'" "$bin" --heads 0
expect 1 "cannot write --csv" "$bin" "${args[@]}" --csv "$dir/no/such/dir.csv"
"$bin" --help | grep -q -- '--eval-every' || fail "--help"
echo "all passed"
