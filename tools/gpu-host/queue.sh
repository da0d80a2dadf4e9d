#!/usr/bin/env bash
# Runs several run.sh modes one after another in the background on the lent GPU host, so that a
# queue longer than one device call (600 s) keeps the GPU busy between calls (docs/gpu-host.md).
#   queue.sh start "VAR=x mode1" "mode2" ...   copy this tree to /root/queue/src and start there
#   queue.sh start-file FILE                    the same, one entry a line ('#' lines skipped)
#   queue.sh poll SECONDS                       wait until the queue ends or SECONDS pass, then
#                                               pack what it has written so far into
#                                               $OUT/<queue dir name>.tgz (queue.tgz by default)
# Each entry is optional VAR=value words and a run.sh mode; its output lands in
# $GPU_QUEUE_DIR/<n>-<mode>/ (default /root/queue, on the GPU host); two queues with different
# GPU_QUEUE_DIR run side by side (e.g. a CPU-bound compile beside GPU cells).
set -uo pipefail
Q=${GPU_QUEUE_DIR:-/root/queue}  # on the GPU host
case "$1" in
  start-file)
    [ -f "${2:-}" ] || { echo "queue.sh start-file: no file '${2:-}' (one entry a line)" >&2; exit 2; }
    mapfile -t lines < <(grep -v -e '^#' -e '^[[:space:]]*$' "$2")
    [ ${#lines[@]} -gt 0 ] || { echo "queue.sh start-file: $2 has no entry" >&2; exit 2; }
    exec bash "$0" start "${lines[@]}" ;;
  start)
    shift
    rm -rf "$Q" && mkdir -p "$Q/src"
    tar -c --exclude=./.gpu --exclude=./results . | tar -x -C "$Q/src"
    printf '%s\n' "$@" > "$Q/entries"
    setsid nohup bash -c '
      cd '"$Q"'/src; n=0; set -f  # globs in an entry are for harness, not for this shell
      while read -r entry; do
        n=$((n + 1)); mode=${entry##* }; dir='"$Q"'/$n-$mode; mkdir -p "$dir"
        echo "$(date +%T) start $entry" >> '"$Q"'/progress
        start=$(date +%s)
        vars=""; [ "$entry" != "$mode" ] && vars=${entry% *}
        env $vars OUT="$dir" timeout 1500 bash tools/gpu-host/run.sh "$mode" > "$dir/log" 2>&1
        echo "$(date +%T) end $entry: rc $? after $(( $(date +%s) - start )) s" >> '"$Q"'/progress
      done < '"$Q"'/entries
      touch '"$Q"'/done' > "$Q/queue.log" 2>&1 < /dev/null &
    echo "queue started: $(wc -l < "$Q/entries") entries" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while [ ! -e "$Q/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cat "$Q/progress" 2>/dev/null
    [ -e "$Q/done" ] && echo "queue done" || echo "queue still running"
    # one file: a runner may bring back only a few files per call
    mkdir -p "${OUT:-/tmp/out}"
    (cd "$Q" && tar czf "${OUT:-/tmp/out}/$(basename "$Q").tgz" progress $(ls -d [0-9]*-* 2>/dev/null))
    tail -n 5 "$Q"/[0-9]*-*/log 2>/dev/null ;;
esac
