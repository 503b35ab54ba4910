#!/usr/bin/env bash
# One host, one model, four ways to run it: one process with 1 thread, one process with 2 threads,
# two 1-thread tensor-parallel ranks, two 1-thread pipeline stages (mpirun -np 2, shared memory).
# Three workloads through `gale batch` on a Llama-2-7B-shaped Q4_0 synth of 6 layers: prefill (4
# prompts of ~600 tokens in one step, one token each), one stream (128 tokens), 16 streams (48
# tokens each).
# The runs alternate between the four; prints the median seconds and generated tok/s of each and
# writes JSON. On one host both ranks share the memory bus: this measures what the split costs and
# what two cores give, not what two hosts give (scripts/pipeline-model.py models that).
#   scripts/parallel-bench.sh [build/gale] [reps] [out.json]
set -euo pipefail
GALE="${1:-build/gale}"
REPS="${2:-3}"
OUT="${3:-parallel-bench.json}"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$GALE" synth --shape custom --arch llama --dim 4096 --layers 6 --heads 32 --kv-heads 32 --ffn 11008 --vocab 32000 \
  --ctx 4096 --type q4_0 -o "$tmp/m.gguf" >/dev/null
words="$(printf 'the little dog ran over the hill and %.0s' $(seq 1 50))"
for i in 1 2 3 4; do echo "{\"prompt\": \"$i $words\", \"max_tokens\": 1, \"temperature\": 0}"; done >"$tmp/prefill.jsonl"
echo '{"prompt": "Once upon a time", "max_tokens": 128, "ignore_eos": true, "temperature": 0}' >"$tmp/one.jsonl"
for i in $(seq 1 16); do
  echo "{\"prompt\": \"Story $i: once upon a time\", \"max_tokens\": 48, \"ignore_eos\": true, \"temperature\": 0}"
done >"$tmp/many.jsonl"

declare -A cmd
cmd[one-1t]="$GALE batch -t 1"
cmd[one-2t]="$GALE batch -t 2"
cmd[tp2]="${MPIRUN[*]} $GALE batch -t 1 --tensor-parallel 2"
cmd[pp2]="${MPIRUN[*]} $GALE batch -t 1 --pipeline-parallel 2 --pipeline-micro-batches 4"
configs=(one-1t one-2t tp2 pp2)
# The whole prefill in one step (four sequences: the pipeline's four micro-batches).
declare -A extra=([prefill]="--max-num-batched-tokens 2560 --prefill-chunk-size 640" [one]="" [many]="")
declare -A secs tps
for work in prefill one many; do
  for rep in $(seq 1 "$REPS"); do
    for c in "${configs[@]}"; do
      line="$(${cmd[$c]} ${extra[$work]} -m "$tmp/m.gguf" -i "$tmp/$work.jsonl" -o "$tmp/$c-$work.jsonl" --no-progress 2>&1 | grep '^batch:')"
      s="$(sed -E 's/.* in ([0-9.]+) s:.*/\1/' <<<"$line")"
      g="$(sed -E 's/.*; ([0-9.]+) generated tok\/s.*/\1/' <<<"$line")"
      p="$(sed -E 's/.*: ([0-9]+) prompt.*/\1/' <<<"$line")"
      secs[$c-$work]+="$s "
      tps[$c-$work]+="$g "
      echo "$work rep $rep $c: $s s, $g generated tok/s ($p prompt tokens)" >&2
    done
  done
  for c in "${configs[@]}"; do
    cmp -s "$tmp/one-1t-$work.jsonl" "$tmp/$c-$work.jsonl" || [ "$c" = tp2 ] || echo "note: $c's $work output differs from one process's" >&2
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| workload | one process, 1 thread | one process, 2 threads | 2 tensor-parallel ranks | 2 pipeline stages |"
echo "|---|---|---|---|---|"
json="{\"reps\": $REPS, \"results\": {"
first=1
for work in prefill one many; do
  row="| $work |"
  for c in "${configs[@]}"; do
    ms="$(median "${secs[$c-$work]}")"
    mt="$(median "${tps[$c-$work]}")"
    row+=" $ms s ($mt tok/s) |"
    [ $first -eq 1 ] || json+=", "
    first=0
    json+="\"$c/$work\": {\"seconds\": [${secs[$c-$work]// /, }], \"generated_tok_s\": [${tps[$c-$work]// /, }]}"
  done
  echo "$row"
done
json="${json//, ]/]}}}"
echo "$json" >"$OUT"
echo "wrote $OUT"
