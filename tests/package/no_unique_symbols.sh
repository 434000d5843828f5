#!/bin/sh
# Fails if the library defines a flashattn symbol as a GNU unique symbol visible outside it: the
# dynamic linker binds those process-wide across every copy of the library (two libraries that
# each link flashattn statically), so one copy's function-local statics become another's — a
# second copy skips its own cudaFuncSetAttribute and its launches fail. The library
# is compiled with hidden visibility (FLASHATTN_API in flashattn.hpp exports the public API), which
# leaves such symbols UNIQUE but HIDDEN in the objects; the final link makes them local.
#   tests/package/no_unique_symbols.sh path/to/libflashattn.a
set -eu
lib=$1
bad=$(readelf -sW "$lib" | awk '$5 == "UNIQUE" && $6 != "HIDDEN" && $8 ~ /9flashattn/ { print $8 }' | sort -u)
total=$(readelf -sW "$lib" | awk '$5 == "UNIQUE" && $8 ~ /9flashattn/' | wc -l)
if [ -n "$bad" ]; then
  echo "exported GNU unique flashattn symbols in $lib:"
  echo "$bad" | c++filt
  exit 1
fi
echo "ok: no exported unique flashattn symbols ($total hidden ones)"
