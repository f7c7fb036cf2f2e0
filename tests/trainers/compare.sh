#!/usr/bin/env bash
# scripts/cclz-compare end to end on a tiny model: two compressors, one
# seed, 20 steps on 2 ranks; the CSVs, the three plots and a table row per
# compressor with the numbers of its CSV; --tabulate makes the same table
# from the CSVs; then a bad spec: exit 1, the failure named in the output
# and the table, the good run still tabled; a missing trainer: exit 2.
# Usage: compare.sh CCLZ_COMPARE BUILD_DIR
set -euo pipefail
compare=$(realpath "$1")
build=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
tiny=(--build "$build" --out out --steps 20 --seeds 1 --ranks 2 --layers 2 --width 64 --heads 2 --context 32
  --batch 8 --eval-every 5)
"$compare" "${tiny[@]}" --run ok --compressors "none ef+topk:ratio=0.01" >log.txt 2>&1 || fail "exit $?: $(cat log.txt)"
for f in csv/none.seed1.csv csv/ef-topk_ratio0.01.seed1.csv logs/none.seed1.txt val_vs_step.png val_vs_bytes.png val_vs_time.png table.md; do
  [[ -s out/ok/$f ]] || fail "out/ok/$f missing"
done
for png in out/ok/*.png; do
  [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$png is not a PNG"
done
[[ $(grep -c '^| none \|^| ef+topk:ratio=0.01 ' out/ok/table.md) -eq 2 ]] || fail "table rows: $(cat out/ok/table.md)"
# The table's numbers come from the CSVs: the final validation loss and the bytes per step.
val=$(tail -1 out/ok/csv/none.seed1.csv | cut -d, -f3)
grep -q "^| none | 1 | [0-9.]* +- 0.0000 | $(printf '%.4f' "$val") +- 0.0000 |" out/ok/table.md ||
  fail "none's final val loss $val is not in the table: $(grep '^| none' out/ok/table.md)"
sent=$(awk -F, 'NR > 1 { s += $9; n++ } END { printf "%.3f", s / n / 1e6 }' out/ok/csv/ef-topk_ratio0.01.seed1.csv)
grep '^| ef+topk' out/ok/table.md | grep -q "| $sent MB |" || fail "ef+topk's $sent MB/step is not in the table"
# The wait for reductions comes from cclz-train's summary line in the run's log.
waited=$(grep -o 'waited [0-9.]* ms/step' out/ok/logs/none.seed1.txt | tail -1 | awk '{ printf "%.1f", $2 }')
[[ -n $waited ]] && grep '^| none ' out/ok/table.md | grep -q "| $waited |" ||
  fail "none's wait '$waited' ms/step is not in the table: $(grep '^| none' out/ok/table.md)"
# --tabulate reads the CSVs again and trains nothing: the same table.
cp out/ok/table.md table-run.md
"$compare" "${tiny[@]}" --run ok --compressors "none ef+topk:ratio=0.01" --tabulate >tab.txt 2>&1 ||
  fail "--tabulate exit $?: $(cat tab.txt)"
cmp -s table-run.md out/ok/table.md || fail "--tabulate made another table: $(diff table-run.md out/ok/table.md)"

rc=0
"$compare" "${tiny[@]}" --run bad --compressors "bf16 topk:ratio=7" >bad.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] || fail "a bad spec exited $rc, not 1"
grep -q "compressor spec 'topk:ratio=7'" bad.txt || fail "the bad spec is not named: $(cat bad.txt)"
grep -q '^| bf16 ' out/bad/table.md || fail "the good run is not in the partial table"
grep -q "topk:ratio=7 seed 1" out/bad/table.md || fail "the failure is not listed in the table"
rc=0
"$compare" --build "$work/nowhere" --compressors none >missing.txt 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q "nowhere/trainers/cclz-train not found: build it first" missing.txt ||
  fail "a missing trainer: exit $rc, $(cat missing.txt)"
echo "cclz-compare: CSVs, 3 PNGs, table rows from the CSVs; a bad spec fails by name, the rest is tabled"
