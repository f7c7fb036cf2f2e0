#!/usr/bin/env bash
# cclz-train end to end on real ranks (mpiexec): one check per call, named by
# the first argument, so each is its own meson test.
#   equivalence N  N ranks train 20 steps like cclz-train-local on the same
#                  global batch: train losses within 1e-5 relative
#   resume SPEC    a run stopped after step 10 and resumed equals (bitwise,
#                  losses) one that ran 20 steps straight
#   crash          a rank dies halfway through writing the step-10
#                  checkpoint; resuming starts from step 5 and equals the
#                  straight run from there
#   local-steps    local SGD every 4 steps: bytes only on sync steps, loss falls
#   bad-input      missing data, short corpus, bad spec, other model shape,
#                  batch not divisible: exit 2 with the message, before training
# Usage: train_dp.sh CHECK [ARG] MPIEXEC CCLZ_TRAIN CCLZ_TRAIN_LOCAL
set -euo pipefail
check=$1
shift
arg=""
if [[ $check == equivalence || $check == resume ]]; then
  arg=$1
  shift
fi
mpiexec=$1 train=$(realpath "$2") local=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1
tiny=(--layers 2 --width 64 --heads 2 --context 32 --batch 8 --quiet)
fail() {
  echo "FAIL ($check $arg): $*" >&2
  exit 1
}
run() { timeout 120 "$mpiexec" -n "$@"; }
losses() { cut -d, -f1-3 "$1" | tail -n +2; }

case $check in
  equivalence)
    "$local" "${tiny[@]}" --steps 20 --eval-every 10 --csv local.csv >/dev/null
    run "$arg" "$train" "${tiny[@]}" --steps 20 --eval-every 10 --csv dp.csv >/dev/null
    [[ $(wc -l <dp.csv) -eq 21 ]] || fail "dp.csv has $(wc -l <dp.csv) lines"
    head -1 dp.csv | grep -qx 'step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,elapsed_s,bytes_sent,dense_bytes' ||
      fail "CSV header: $(head -1 dp.csv)"
    paste -d, <(cut -d, -f2 local.csv) <(cut -d, -f2 dp.csv) | awk -F, -v n="$arg" '
      NR > 1 { r = ($2 - $1) / $1; if (r < 0) r = -r; if (r > m) m = r; k++ }
      END { printf "%s ranks: %d steps, max relative difference of the train loss %.3g\n", n, k, m;
            exit !(k == 20 && m <= 1e-5) }' || fail "losses differ by more than 1e-5 relative"
    # Dense bytes: 2 (N-1)/N of the 134912 gradient floats, as sent.
    want=$(( 2 * (arg - 1) * 134912 * 4 / arg ))
    awk -F, -v w="$want" 'NR > 1 && ($9 != w || $10 != w) { bad = 1 } END { exit bad }' dp.csv ||
      fail "bytes_sent/dense_bytes are not $want every step"
    ;;
  resume)
    common=("${tiny[@]}" --steps 20 --eval-every 5 --bucket-kb 64 --compressor "$arg")
    run 2 "$train" "${common[@]}" --csv full.csv >/dev/null
    run 2 "$train" "${common[@]}" --checkpoint ck --checkpoint-every 5 --stop-after 10 --csv a.csv >/dev/null
    [[ $(cat ck/latest) == 10 ]] || fail "latest is '$(cat ck/latest)' after stopping at 10"
    run 2 "$train" "${common[@]}" --checkpoint ck --resume --csv b.csv >/dev/null
    diff <(losses full.csv) <(losses a.csv; losses b.csv) >/dev/null || fail "the resumed run's losses differ"
    echo "$arg: 10 + 10 resumed steps equal 20 straight ones, bitwise"
    ;;
  crash)
    common=("${tiny[@]}" --steps 20 --eval-every 5 --bucket-kb 64 --compressor ef+topk:ratio=0.01)
    run 2 "$train" "${common[@]}" --csv full.csv >/dev/null
    if CCLZ_TRAIN_TEST_CRASH_IN_WRITE=step-10.rank-1 run 2 "$train" "${common[@]}" --checkpoint ck \
      --checkpoint-every 5 >/dev/null 2>crash.txt; then
      fail "the run with a crash in its checkpoint succeeded"
    fi
    grep -q 'test crash while writing' crash.txt || fail "no crash: $(cat crash.txt)"
    [[ -f ck/step-10.rank-1.ckpt.tmp && ! -f ck/step-10.rank-1.ckpt ]] || fail "expected a partial temp file only"
    [[ $(cat ck/latest) == 5 ]] || fail "latest is '$(cat ck/latest)', not the last complete checkpoint 5"
    run 2 "$train" "${common[@]}" --checkpoint ck --checkpoint-every 5 --resume --csv b.csv >/dev/null
    diff <(losses full.csv | tail -n +6) <(losses b.csv) >/dev/null || fail "resumed from 5, the losses differ"
    echo "crash mid-checkpoint at step 10: resumed from step 5, equal to the straight run"
    ;;
  local-steps)
    run 2 "$train" "${tiny[@]}" --steps 40 --eval-every 20 --local-steps 4 --csv ls.csv >/dev/null
    awk -F, 'NR > 1 { if (($1 % 4 == 0) != ($9 > 0)) bad = 1; if (NR == 2) first = $2; last = $2 }
             END { printf "local SGD: train loss %.4f -> %.4f\n", first, last; exit bad || !(last < first - 0.5) }' ls.csv ||
      fail "bytes not only on every 4th step, or the loss did not fall"
    ;;
  bad-input)
    printf 'short' >short.txt
    run 2 "$train" "${tiny[@]}" --steps 4 --checkpoint ck --csv ok.csv >/dev/null
    expect() {  # ranks, message, args...
      local n=$1 msg=$2
      shift 2
      local rc=0
      run "$n" "$train" "${tiny[@]}" --steps 4 "$@" >out.txt 2>err.txt || rc=$?
      [[ $rc -eq 2 ]] || fail "$* exited $rc, not 2: $(cat err.txt)"
      grep -qF -- "$msg" err.txt || fail "$*: message lacks '$msg': $(cat err.txt)"
      if grep -q '^step ' out.txt; then fail "$*: training started"; fi
    }
    expect 2 "file '/nonexistent/corpus.txt' does not exist" --data /nonexistent/corpus.txt
    expect 2 "too short for context 32" --data short.txt
    expect 2 "compressor spec 'topk:ratio=0'" --compressor topk:ratio=0
    expect 2 "compressor spec 'nosuch'" --compressor nosuch
    expect 2 "it holds a model of L=2 C=64" --width 32 --checkpoint ck --resume
    expect 2 "no checkpoint in" --checkpoint empty --resume
    expect 3 "must be divisible by the 3 ranks"
    echo "bad input: every case exits 2 before training, with its message"
    ;;
  *)
    fail "unknown check"
    ;;
esac
