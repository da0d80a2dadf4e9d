#!/usr/bin/env bash
# Writes each wheelhouse part DIR/p<i>/te-core.part.<i> as two halves DIR/h<i>a/te-core.part.<i>.a
# and DIR/h<i>b/te-core.part.<i>.b, for uploads whose size limit a whole part plus the working
# tree exceeds (docs/gpu-host.md, "Uploads over a size limit"). Usage: halve-parts.sh [DIR]
set -euo pipefail
DIR=${1:-.gpu}
for part in "$DIR"/p[0-9]/te-core.part.[0-9]; do
  i=${part##*.}
  size=$(stat -c %s "$part"); half=$(( (size + 1) / 2 ))
  mkdir -p "$DIR/h${i}a" "$DIR/h${i}b"
  head -c "$half" "$part" > "$DIR/h${i}a/te-core.part.$i.a"
  tail -c +$(( half + 1 )) "$part" > "$DIR/h${i}b/te-core.part.$i.b"
  cat "$DIR/h${i}a/te-core.part.$i.a" "$DIR/h${i}b/te-core.part.$i.b" | cmp -s - "$part" \
    || { echo "halve-parts: halves of $part do not add up to it" >&2; exit 1; }
  echo "$part -> $DIR/h${i}a, $DIR/h${i}b"
done
