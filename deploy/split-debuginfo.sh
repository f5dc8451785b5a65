#!/bin/sh
# Splits release binaries into what ships and what a maintainer debugs with (issue #33):
#
#   deploy/split-debuginfo.sh FROM_DIR OUT_DIR BINARY...
#
# OUT_DIR/BINARY is FROM_DIR/BINARY stripped of symbols and debug info (about a seventh of its size),
# with a .gnu_debuglink naming its debug file; OUT_DIR/debug/usr/lib/debug/usr/local/bin/
# BINARY.debug holds its symbols and line tables, where gdb looks for the debug file of
# /usr/local/bin/BINARY. The Dockerfile's `symbols` stage keeps those files. Needs objcopy
# (binutils).
set -eu
[ $# -ge 3 ] || { echo "usage: $0 FROM_DIR OUT_DIR BINARY..." >&2; exit 2; }
from=$1
out=$2
shift 2
debug=$out/debug/usr/lib/debug/usr/local/bin
mkdir -p "$out" "$debug"
for bin in "$@"; do
  objcopy --only-keep-debug "$from/$bin" "$debug/$bin.debug"
  chmod 0644 "$debug/$bin.debug"
  # The link holds the debug file's name and CRC: gdb takes it only if it matches.
  objcopy --strip-all --add-gnu-debuglink="$debug/$bin.debug" "$from/$bin" "$out/$bin"
  chmod 0755 "$out/$bin"
done
