#!/usr/bin/env bash
# gale and llama.cpp side by side on this machine, on the same GGUF files: prompt processing
# (pp512) and generation (tg128) at 2 threads, the two engines run alternately (REPS times each,
# one repetition per run, so both see the same drift of a noisy VM), medians and ratios printed
# as a table and written to OUT (JSON). Models: gale's random-weight synth files (llama.cpp loads
# them as its own), 110m by default; SHAPES="110m tinyllama-1.1b" adds the 1.1B model (2.2 GB F16,
# slow). SEQS=16 adds aggregate decode of TG tokens for each of 16 sequences at once ("tg128 x16").
#
# Which llama.cpp (the same release either way, 2026-09-28):
# - by default, built from source for this CPU (GGML_NATIVE) by scripts/build-llamacpp.sh into
#   LLAMA_DIR (default $BUILD_DIR/llamacpp-native; built once, then reused): the fastest llama.cpp
#   on this machine, and the reference of README's figures. pp/tg are its own llama-bench; SEQS
#   drives its libllama.so through tools/ggml_reference.cc (llama-bench has no many-sequence test).
# - LLAMA_BENCH=path/to/llama-bench: an llama.cpp you built already; nothing is built or fetched.
#   SEQS needs its shared libraries (libllama.so, libggml*.so) in the same folder, as a CMake build
#   of llama.cpp leaves them.
# - LLAMA=prebuilt: the generic CPU build of the npm package @node-llama-cpp/linux-x64
#   (scripts/fetch-llamacpp.sh), driven by tools/ggml_reference.cc as llama-bench drives it.
#
#   scripts/bench-vs-llamacpp.sh [OUT.json]
#   TYPES="q4_0 q8_0" REPS=5 PP=512 TG=128 THREADS=2 scripts/bench-vs-llamacpp.sh
#   SHAPES=qwen3-30b-a3b TYPES="q4_0 q4_k" SEQS=16 scripts/bench-vs-llamacpp.sh  # the mixture
#   LLAMA=prebuilt TYPES="f16 bf16" scripts/bench-vs-llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/bench-vs-llamacpp.json}"
build="${BUILD_DIR:-build}"
types="${TYPES:-f16 bf16 q8_0 q4_0 q4_k iq4_xs}"
shapes="${SHAPES:-110m}"
reps="${REPS:-3}" pp="${PP:-512}" tg="${TG:-128}" threads="${THREADS:-2}" seqs="${SEQS:-}"
models="${MODELS_DIR:-$build/bench-models}"
llama_bench="${LLAMA_BENCH:-}"
cmake --build "$build" -j"$(nproc)" --target gale ggml_reference > /dev/null
if [[ "${LLAMA:-native}" == prebuilt ]]; then
  [[ -z "$llama_bench" ]] || { echo "LLAMA=prebuilt and LLAMA_BENCH name two llama.cpp builds; pick one" >&2; exit 2; }
  lib="$(scripts/fetch-llamacpp.sh "$build/llamacpp")"
  engine="llama.cpp (prebuilt npm CPU build)"
elif [[ "${LLAMA:-native}" == native ]]; then
  [[ -n "$llama_bench" ]] || llama_bench="$(scripts/build-llamacpp.sh "${LLAMA_DIR:-$build/llamacpp-native}")"
  [[ -x "$llama_bench" ]] || { echo "LLAMA_BENCH: $llama_bench is not an executable" >&2; exit 2; }
  lib="$(dirname "$(realpath "$llama_bench")")"
  if [[ -n "$seqs" && ! -e "$lib/libllama.so" ]]; then
    echo "SEQS drives libllama.so, which is not beside $llama_bench; build llama.cpp with shared libraries" >&2
    exit 2
  fi
  engine="llama.cpp (llama-bench, $llama_bench)"
else
  echo "LLAMA must be native or prebuilt" >&2
  exit 2
fi
echo "gale against $engine" >&2
mkdir -p "$models"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for shape in $shapes; do
  for type in $types; do
    m="$models/$shape-$type.gguf"
    [[ -e "$m" ]] || "$build/gale" synth --shape "$shape" --type "$type" -o "$m" 2> /dev/null
    for ((r = 0; r < reps; ++r)); do
      if [[ "${LLAMA:-native}" == native ]]; then
        "$llama_bench" -m "$m" -p "$pp" -n "$tg" -r 1 -t "$threads" -o jsonl 2> /dev/null |
          python3 -c 'import json, sys
for line in sys.stdin:
    e = json.loads(line)
    test = ("pp%d" % e["n_prompt"]) if e["n_gen"] == 0 else ("tg%d" % e["n_gen"])
    print(json.dumps({"shape": sys.argv[1], "type": sys.argv[2], "engine": "llama.cpp", "test": test,
                      "threads": e["n_threads"], "tokens_per_second": e["samples_ts"]}))' "$shape" "$type" >> "$results"
      else
        LD_LIBRARY_PATH="$lib" "$build/ggml_reference" bench "$lib" "$m" "$pp" "$tg" 1 "$threads" 2> /dev/null |
          sed "s/^{/{\"shape\": \"$shape\", \"type\": \"$type\", /" >> "$results"
      fi
      "$build/gale" bench -m "$m" -p "$pp" -n "$tg" -r 1 -t "$threads" -o json 2> /dev/null |
        python3 -c 'import json, sys
for e in json.load(sys.stdin):
    print(json.dumps({"shape": sys.argv[1], "type": sys.argv[2], "engine": "gale", "test": e["test"],
                      "threads": e["threads"], "tokens_per_second": [e["tokens_per_second"]]}))' "$shape" "$type" >> "$results"
      for s in $seqs; do
        LD_LIBRARY_PATH="$lib" "$build/ggml_reference" bench "$lib" "$m" 0 "$tg" 1 "$threads" "$s" 2> /dev/null |
          sed "s/^{/{\"shape\": \"$shape\", \"type\": \"$type\", /; s/\"test\": \"tg$tg\"/\"test\": \"tg$tg x$s\"/" >> "$results"
        "$build/gale" bench -m "$m" -p 0 -n "$tg" -r 1 -t "$threads" --batch "$s" -o json 2> /dev/null |
          python3 -c 'import json, sys
for e in json.load(sys.stdin):
    print(json.dumps({"shape": sys.argv[1], "type": sys.argv[2], "engine": "gale", "test": e["test"] + " x" + sys.argv[3],
                      "threads": e["threads"], "tokens_per_second": [e["tokens_per_second"]]}))' "$shape" "$type" "$s" >> "$results"
      done
    done
  done
done
python3 - "$results" "$out" "$engine" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = {}
for r in rows:
    runs.setdefault((r["shape"], r["type"], r["test"]), {}).setdefault(r["engine"], []).extend(r["tokens_per_second"])
table = []
print("| model | type | test | llama.cpp tok/s | gale tok/s | gale / llama.cpp |")
print("|---|---|---|---|---|---|")
for (shape, typ, test), e in runs.items():
    if "gale" not in e or "llama.cpp" not in e:
        continue
    g, l = statistics.median(e["gale"]), statistics.median(e["llama.cpp"])
    table.append({"shape": shape, "type": typ, "test": test, "llamacpp_tokens_per_second": l,
                  "gale_tokens_per_second": g, "ratio": g / l, "gale_runs": e["gale"], "llamacpp_runs": e["llama.cpp"],
                  "llamacpp_build": sys.argv[3]})
    print(f"| {shape} | {typ} | {test} | {l:,.1f} | {g:,.1f} | {g / l:.2f}x |")
json.dump(table, open(sys.argv[2], "w"), indent=2)
print(f"wrote {sys.argv[2]}")
PY
