#!/bin/sh
# Profile one loop of profile_target.py with py-spy, client and server at once.
#   sh benchmarks/experiments/profile.sh WHAT SECONDS OUTDIR
# Writes OUTDIR/WHAT.client.txt and OUTDIR/WHAT.server.txt (py-spy's collapsed stacks, native
# frames included); summarize them with collapse_summary.py. Bounded: py-spy records at most
# SECONDS + 5 s on the server, and the target's loop stops after SECONDS.
set -eu
WHAT=$1; SECONDS_=$2; OUT=$3
HERE=$(dirname "$0")
PY=/work/venv/bin/python
SPY=/work/venv/bin/py-spy
mkdir -p "$OUT"
PIDFILE=$(mktemp)
rm -f "$PIDFILE"
timeout $((SECONDS_ + 60)) "$SPY" record --native -r 100 -f raw -o "$OUT/$WHAT.client.txt" -- \
    "$PY" "$HERE/profile_target.py" "$WHAT" "$SECONDS_" "$PIDFILE" > "$OUT/$WHAT.log" 2>&1 &
CLIENT=$!
n=0
while [ ! -s "$PIDFILE" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
timeout $((SECONDS_ + 10)) "$SPY" record --native -r 100 -f raw -d $((SECONDS_ + 1)) \
    -p "$(cat "$PIDFILE")" -o "$OUT/$WHAT.server.txt" >> "$OUT/$WHAT.log" 2>&1 || true
wait $CLIENT || true
rm -f "$PIDFILE"
