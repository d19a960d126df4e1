#!/usr/bin/env bash
# PostgreSQL 15 taken to a machine without it: Debian bookworm's server binaries, their
# share folder and every library they load (beside glibc), packed at their Debian paths.
# call1.sh unpacks it there and copies only the libraries that machine lacks.
#
#   docs/benchmarks/postgres/xeon16/bundle.sh .pgb/pg.tar.xz
set -euo pipefail
out="$1"
root="$(mktemp -d)"
mkdir -p "$root/usr/lib/postgresql/15/bin" "$root/usr/share/postgresql" "$root/opt/pglib" "$root/usr/share/zoneinfo"
for b in postgres initdb pg_ctl; do cp -a "/usr/lib/postgresql/15/bin/$b" "$root/usr/lib/postgresql/15/bin/"; done
cp -a /usr/lib/postgresql/15/lib "$root/usr/lib/postgresql/15/"
rm -rf "$root/usr/lib/postgresql/15/lib/bitcode" "$root"/usr/lib/postgresql/15/lib/llvmjit*
cp -a /usr/share/postgresql/15 "$root/usr/share/postgresql/"
rm -rf "$root/usr/share/postgresql/15/man"
cp -a /usr/share/zoneinfo/UTC /usr/share/zoneinfo/Etc "$root/usr/share/zoneinfo/"
for b in postgres initdb pg_ctl; do ldd "/usr/lib/postgresql/15/bin/$b"; done |
  awk '/=>/ {print $3}' | sort -u |
  grep -v -E 'libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libstdc\+\+|libgcc_s|libresolv' |
  xargs -I{} cp -L {} "$root/opt/pglib/"
mkdir -p "$(dirname "$out")"
tar -cf - -C "$root" . | xz -9 -T2 > "$out"
rm -rf "$root"
ls -la "$out"
