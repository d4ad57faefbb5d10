#!/usr/bin/env bash
# One GPU-machine session after a GPU kernel change (bench/README.md, "LLM decode and prefill"), in steps that each
# fit one device call: the GPU machine has the packages the exporter needs but not this one installed, so it runs
# from the working tree. Results land in bench/results/ and, when $OUT is set (the device tool), are copied there.
#   bench/device_session.sh tests        the GPU tests of state, methods and the CUDA loader
#   bench/device_session.sh decode B [M] bench/decode.py at batch B for model M (default: gpt2, then llama, each in
#                                        its own process, so that a cut-off second keeps the first's results)
#   bench/device_session.sh probe NAME [ARGS]  python -m bench.probes.NAME ARGS (a probe that imports the exporter)
#   bench/device_session.sh zoo S [MODELS]  the GPU zoo table, under a deadline of S seconds (MODELS: those only,
#                                        merged into the newest *zoo-cuda.json)
#   bench/device_session.sh zoo-aoti S [MODELS]  AOTInductor on the GPU over the zoo (its pass counts beside ours),
#                                        merged into the newest *zoo-cuda.json
set -u
cd "$(dirname "$0")/.."
ns=$(mktemp -d)/ns
mkdir -p "$ns/tcexport"
for d in exporter packager loader formats serving; do ln -sfn "$PWD/$d" "$ns/tcexport/$d"; done
# The CPU loader's BLAS (scipy-openblas32) is not on the GPU machine, which has no network: bring its wheel with the
# tree (`pip download scipy-openblas32 --no-deps -d .device-wheels`, then run(carry=[".device-wheels"])).
ls .device-wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target "$ns" .device-wheels/*.whl
export PYTHONPATH="$ns:$PWD:$PWD/tests" TCEXPORT_CACHE="${TCEXPORT_CACHE:-$PWD/.device-cache}"
out=${OUT:-bench/results}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9][0-9]*' | head -1 | tr H h)
gpu=${gpu:-gpu}  # h100 or h200 (the first H-number of the name: "H100 80GB HBM3" also has an H in HBM3)
step=${1:?tests, decode B, probe NAME, zoo S or zoo-aoti S}
case "$step" in
  tests)
    timeout "${2:-450}" python3 -m pytest -q -p no:cacheprovider tests/test_state_gpu.py tests/test_methods.py \
      tests/test_cuda_gpu.py 2>&1 | tail -40 ;;
  decode)
    b=${2:-1}
    for m in ${3:-gpt2 llama}; do
      timeout "${4:-280}" python3 -m bench.decode --device cuda --models "$m" --contexts 128 1024 --batch "$b" \
        --runs 50 --profile --out "$gpu-decode-$m-b$b" 2>&1 | tail -30
      cp bench/results/$gpu-decode-$m-b$b.* "$out/" 2>/dev/null
    done ;;
  probe)
    shift; name=${1:?probe NAME}; shift
    python3 -m "bench.probes.$name" "$@" 2>&1 ;;
  zoo)
    # zoo S MODELS: only those (comma-separated), merged into the newest GPU table here
    prev=$(ls -t bench/results/*zoo-cuda.json 2>/dev/null | head -1)
    python3 -m bench.zoo_table --device cuda --jobs 6 --timeout 240 --deadline "${2:-500}" \
      ${3:+--models "$3"} ${3:+${prev:+--merge "$prev"}} 2>&1 | tail -70
    cp bench/results/*zoo-cuda* "$out/" 2>/dev/null ;;
  zoo-aoti)
    prev=$(ls -t bench/results/*zoo-cuda.json 2>/dev/null | head -1)
    python3 -m bench.zoo_table --device cuda --peers aoti --only-peers --jobs 8 --timeout 400 --deadline "${2:-500}" \
      ${3:+--models "$3"} ${prev:+--merge "$prev"} 2>&1 | tail -70
    cp bench/results/*zoo-cuda* "$out/" 2>/dev/null ;;
esac
