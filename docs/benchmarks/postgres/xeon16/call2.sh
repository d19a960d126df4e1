#!/bin/bash
# Second call: stage the default model's second part; bench shared again on a fresh
# PostgreSQL (the first call's server went with it), daemons in the other order.
set -u
M=/root/m
cp .gpu2/part1 $M/part1
if ldd $M/memctl | grep -q "not found"; then export LD_LIBRARY_PATH=$(find /usr /opt /lib -xdev \( -name libcuda.so.1 -o -name libcublas.so.13 -o -name libcurand.so.10 -o -name libcudart.so.13 \) -printf "%h\n" 2>/dev/null | sort -u | tr "\n" ":"); echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> $OUT/ldpath.txt; fi
export TZ=UTC
url=$(scripts/test-postgres start /tmp/pgdata2 2>>$OUT/pg2.log); echo "url=$url" >> $OUT/pg2.log
B="$M/memctl --tokenizer $M/tok.gguf --database $url"
if [ -n "$url" ]; then
  timeout 200 $B bench shared --daemons 3,2,1,3,1 --json > $OUT/shared-r3.json 2>>$OUT/shared2.log; echo "r3 rc=$?" >> $OUT/shared2.log
fi
cat $OUT/pg2.log; cat $OUT/shared2.log
