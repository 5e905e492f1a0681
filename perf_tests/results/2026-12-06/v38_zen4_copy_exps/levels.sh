#!/bin/bash
# lv.sh OUT ROUNDS: old (lvl2, 2b41d8c) and new (lvl3) no-march binaries at each copy level, and native (lvln)
out=$1; rounds=$2
only=copy,loss_and_grad/fused,forward/fused/recompute,backward/fused/recompute
: > $out
for r in $(seq 1 $rounds); do
 for cfg in ${CFGS:-lvln:native lvl2:x86-64-v3 lvl3:x86-64-v3 lvl2:x86-64-v4 lvl3:x86-64-v4 lvl2:x86-64-v4-bf16 lvl3:x86-64-v4-bf16}; do
  b=${cfg%%:*}; lv=${cfg#*:}
  for d in float32 bfloat16 float16; do
   env VPCE_HOST_COPY=$lv OMP_NUM_THREADS=1 OMP_PROC_BIND=false /tmp/s30/vpce_perf_$b ${N:-1024} 32768 $d ${REPS:-5} /tmp/s33/tmp.json $only > /dev/null 2>&1
   /usr/bin/python3 -c "
import json
for x in json.load(open('/tmp/s33/tmp.json')): print('$r $b:$lv $d', x['name'], round(x['ms_median'],2))" >> $out
  done
 done
done
