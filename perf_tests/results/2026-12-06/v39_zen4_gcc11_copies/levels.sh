#!/bin/bash
# levels.sh OUT ROUNDS: each configuration BIN:LEVEL of CFGS runs $BIN_DIR/vpce_perf_BIN with VPCE_HOST_COPY=LEVEL
out=$1; rounds=$2
only=copy,loss_and_grad/fused,forward/fused/recompute,backward/fused/recompute
: > $out
for r in $(seq 1 $rounds); do
 for cfg in $CFGS; do
  b=${cfg%%:*}; lv=${cfg#*:}
  for d in float32 bfloat16 float16; do
   env VPCE_HOST_COPY=$lv OMP_NUM_THREADS=1 OMP_PROC_BIND=false ${BIN_DIR:-.}/vpce_perf_$b ${N:-1024} 32768 $d ${REPS:-5} ${TMPDIR:-/tmp}/levels_tmp.json $only > /dev/null 2>&1
   /usr/bin/python3 -c "
import json
for x in json.load(open('${TMPDIR:-/tmp}/levels_tmp.json')): print('$r $b:$lv $d', x['name'], round(x['ms_median'],2))" >> $out
  done
 done
done
