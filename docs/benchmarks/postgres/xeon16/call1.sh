#!/bin/bash
# First call: stage the cuda build and the default model's first part; PostgreSQL 15
# (carried from a Debian bookworm machine) as an unprivileged user; bench shared with
# 1, 2, 3, 4 and 6 daemons on 300 streams against the stand-in model, two rounds.
set -u
M=/root/m; mkdir -p $M
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo; grep -m3 -E "^(cpu family|model|stepping)\s*:" /proc/cpuinfo; echo "nproc $(nproc)"; grep -o -m1 -E "avx512_vnni|avx512f" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; cat /etc/os-release | head -2; } > $OUT/machine.txt 2>&1
xz -dc .gpu/memctl.xz > $M/memctl && chmod +x $M/memctl
cp .gpu/part0 $M/part0; cp .gpu/tok.gguf $M/tok.gguf
ldd $M/memctl > $OUT/ldd.txt 2>&1
if ldd $M/memctl | grep -q "not found"; then export LD_LIBRARY_PATH=$(find /usr /opt /lib -xdev \( -name libcuda.so.1 -o -name libcublas.so.13 -o -name libcurand.so.10 -o -name libcudart.so.13 \) -printf "%h\n" 2>/dev/null | sort -u | tr "\n" ":"); echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> $OUT/ldpath.txt; fi
mkdir -p /tmp/pg && xz -dc .pgb/pg.tar.xz | tar -xf - -C /tmp/pg
cp -a /tmp/pg/usr/lib/postgresql /usr/lib/ && mkdir -p /usr/share/postgresql && cp -a /tmp/pg/usr/share/postgresql/15 /usr/share/postgresql/
[ -e /usr/share/zoneinfo/UTC ] || { mkdir -p /usr/share/zoneinfo; cp -a /tmp/pg/usr/share/zoneinfo/. /usr/share/zoneinfo/; }
for l in /tmp/pg/opt/pglib/*; do [ -e /usr/lib/x86_64-linux-gnu/$(basename $l) ] || { cp $l /usr/lib/x86_64-linux-gnu/; echo "carried $(basename $l)" >> $OUT/pg.log; }; done; ldconfig
export TZ=UTC
url=$(scripts/test-postgres start /tmp/pgdata 2>>$OUT/pg.log); echo "url=$url" >> $OUT/pg.log
$M/memctl --version >> $OUT/machine.txt 2>&1
B="$M/memctl --tokenizer $M/tok.gguf --database $url"
if [ -n "$url" ]; then
  timeout 200 $B bench shared --daemons 1,2,3,4,6 --json > $OUT/shared-r1.json 2>>$OUT/shared.log; echo "r1 rc=$?" >> $OUT/shared.log
  timeout 120 $B bench shared --daemons 3,1 --json > $OUT/shared-r2.json 2>>$OUT/shared.log; echo "r2 rc=$?" >> $OUT/shared.log
fi
ls /root/.cache/huggingface 2>/dev/null | head > $OUT/hf.txt
cat $OUT/machine.txt $OUT/pg.log; tail -5 $OUT/shared.log
python3 - <<'PY'
import json,os
for f in ("shared-r1.json","shared-r2.json"):
    p=os.path.join(os.environ["OUT"],f)
    try: d=json.load(open(p))
    except Exception as e: print(f,e); continue
    for r in d.get("runs",[]): print(f, {k:r[k] for k in r if not isinstance(r[k],(list,dict))})
PY
