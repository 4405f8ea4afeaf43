#!/usr/bin/env bash
# The why study with its pretraining split by seed: one `python -m probing.study.why ARGS --train-seeds S
# --pretrain-only` process per seed of SEEDS (default 0,1) side by side, then `python -m probing.study.why ARGS`,
# which reuses their runs. A GPU has room for several small models at once and a run of the `small` preset keeps
# the host busy between steps, so side by side they finish sooner than one after another. The first process trains
# the runs' shared tokenizer; the others start once it is written. Runs are the same whichever process trains them.
#   SEEDS=0,1 bash benchmarks/why_split.sh why_questions --preset small --device cuda --pretrain-out P --out O
# (benchmarks/gpu_check.sh's why step; ARGS must name --pretrain-out).
set -u
PY=${PYTHON:-python3}
IFS=, read -r -a seeds <<< "${SEEDS:-0,1}"
args=("$@")
pre=
for ((i = 0; i + 1 < ${#args[@]}; i++)); do [ "${args[i]}" = --pretrain-out ] && pre=${args[i + 1]}; done
[ -n "$pre" ] || { echo "error: give --pretrain-out (where the processes meet)" >&2; exit 2; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
$PY -m probing.study.why "$@" --train-seeds "${seeds[0]}" --pretrain-only &
pids+=($!)
while [ ! -f "$pre/tokenizer/tokenizer.json" ] && kill -0 "${pids[0]}" 2>/dev/null; do sleep 0.5; done
for s in "${seeds[@]:1}"; do
  $PY -m probing.study.why "$@" --train-seeds "$s" --pretrain-only &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
[ $failed -eq 0 ] || { echo "error: $failed pretraining process(es) failed" >&2; exit 1; }
trap - TERM INT
exec $PY -m probing.study.why "$@"
