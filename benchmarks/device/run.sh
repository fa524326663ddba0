#!/bin/bash
# On the lent GPU machine, after benchmarks/device/pack.sh here (see it): the GPU check with Whisper, the
# CUDA-versus-CPU features and the CUDA test, into $OUT (gpu_check.json, parity.json, the logs). 3-4 minutes
# on an H200. Locally, to rehearse on the CPU: OUT=/tmp/out bash benchmarks/device/run.sh cpu --quick
set -eo pipefail
device=${1:-cuda}; shift || true
out=${OUT:-/tmp/out}; site=/tmp/device-site; stub=/tmp/device-stub; models=/tmp/device-models
mkdir -p "$out" "$stub" "$models"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl
cp -r .gpu/stub/* $stub/
export PYTHONPATH=$site:$stub:$PWD PYTHONUNBUFFERED=1
python3 benchmarks/device/prepare.py $stub $models > "$out/prepare.log" 2>&1
python3 -m benchmarks.gpu_check --device "$device" --speech-weights $models/whisper-base $models/whisper-small \
  --speech-audio .gpu/nasa.mp4 --speech-seconds 90 "$@" > "$out/gpu_check.json" 2> "$out/gpu_check.log" \
  || { tail -30 "$out/gpu_check.log"; exit 1; }
cat "$out/gpu_check.json"
if [ "$device" = cuda ]; then
  python3 benchmarks/device/parity.py /tmp > "$out/parity.json" 2> "$out/parity.log" && cat "$out/parity.json"
  python3 -m pytest tests/test_model.py -q -p no:cacheprovider -k cuda 2>&1 | tail -3
fi
