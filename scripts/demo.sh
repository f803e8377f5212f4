#!/bin/sh
# `make demo`: install what is missing, build, then run the main job on an embedded default:
# synthesize a tiny Kimi-Linear checkpoint, audit it (text, then JSON), convert it to MXFP4
# experts, audit the result and generate a reply with the CPU engine.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
make -j"$(nproc)" build/kl
out="${KL_DEMO_DIR:-build/demo/tiny}"
rm -rf "$out"
echo "== kl synth $out --preset tiny --seed 1"
build/kl synth "$out" --preset tiny --seed 1
echo "== kl audit $out --hash --tp 2 --context 32768"
build/kl audit "$out" --hash --tp 2 --context 32768
echo "== kl audit $out --json"
build/kl audit "$out" --json
rm -rf "$out-mxfp4"
echo "== kl convert $out $out-mxfp4"
build/kl convert "$out" "$out-mxfp4"
echo "== kl audit $out-mxfp4"
build/kl audit "$out-mxfp4"
echo "== kl run $out-mxfp4 --chat \"Hello\" -n 16   (a random tiny model: the reply is noise)"
build/kl run "$out-mxfp4" --chat "Hello" -n 16
echo
echo "demo: ok"
