#!/usr/bin/env bash
# A big real capture for the scale checks (not a fixture: hundreds of MB): two TCP connections from
# 10.99.0.1 to 10.99.0.2 sending MEGABYTES each as fast as the veth goes, offloads off, 0.5% of packets
# dropped each way at the receiver (as tcp_loss.sh), captured at the sender with tcpdump -s 96.
# Writes OUT (default: a new folder in the temporary folder): capture.pcap, start and stop (UTC), tcpdump.err.
set -euo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$(mktemp -d -t tracelens-lab-big.XXXXXX)}
PY=${LAB_PYTHON:-python3}
MEGABYTES=${MEGABYTES:-1500}
NS=(tl-lab-a tl-lab-b); DEV=(tl-veth-a tl-veth-b); IP=(10.99.0.1 10.99.0.2)
PIDS=()
source "$LAB/net.sh"
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; net_down; }
trap cleanup EXIT
trap "exit 130" INT TERM

mkdir -p "$OUT"
net_up
for i in 0 1; do ip netns exec "${NS[$i]}" ethtool -K "${DEV[$i]}" tso off gso off gro off >/dev/null; done
nft_table "${NS[1]}" "${DEV[1]}" "numgen random mod 1000 < 5 drop"
ip netns exec "${NS[0]}" tcpdump -i "${DEV[0]}" -s 96 -B 65536 -w "$OUT/capture.pcap" tcp 2>"$OUT/tcpdump.err" &
TCPDUMP=$!; PIDS+=("$TCPDUMP")
sleep 1
ip netns exec "${NS[1]}" "$PY" "$LAB/tcp_streams.py" serve --host "${IP[1]}" --streams 2 &
SERVER=$!; PIDS+=("$SERVER")
sleep 1
date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "$OUT/start"
ip netns exec "${NS[0]}" timeout 300 "$PY" "$LAB/tcp_streams.py" send --host "${IP[1]}" --streams 2 \
    --megabytes "$MEGABYTES" --rate-mbit 100000
wait "$SERVER"
date -u +%Y-%m-%dT%H:%M:%S.%3NZ > "$OUT/stop"
sleep 1
kill -INT "$TCPDUMP"; wait "$TCPDUMP" || true
tail -2 "$OUT/tcpdump.err"
echo "capture written to $OUT"
