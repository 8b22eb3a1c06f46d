#!/usr/bin/env bash
# The standalone TCP loss capture: four TCP connections across a link that drops ~0.5% of
# packets (nftables, both directions). The sender is 10.99.0.1, captured there; the drops are on
# the receiver's input and output. With offloads off the sender's veth cuts TCP's GSO packets
# into MSS-sized segments on transmit, so each dropped packet is one segment, as on a physical
# NIC (nftables on the sender's own output would see, and drop, whole GSO packets).
# Writes FIXTURE_DIR (default fixtures/lab-tcp-loss): the capture, expected.json and a README
# holding tshark's counts.
set -euo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
FIXTURE=${1:-$(dirname "$LAB")/fixtures/lab-tcp-loss}
PY=${LAB_PYTHON:-$LAB/.venv/bin/python}   # lab/setup.sh's venv by default
LOSS=${TCP_LOSS_PERMILLE:-5}   # per mille of packets dropped each way
NS=(tl-lab-a tl-lab-b); DEV=(tl-veth-a tl-veth-b); IP=(10.99.0.1 10.99.0.2)
WORK=$(mktemp -d -t tracelens-lab-tcp.XXXXXX)
PIDS=()
source "$LAB/net.sh"
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; net_down; }
trap cleanup EXIT
trap "exit 130" INT TERM

net_up
for i in 0 1; do ip netns exec "${NS[$i]}" ethtool -K "${DEV[$i]}" tso off gso off gro off >/dev/null; done
nft_table "${NS[1]}" "${DEV[1]}" "numgen random mod 1000 < $LOSS drop"
ip netns exec "${NS[0]}" tcpdump -i "${DEV[0]}" -s 96 -U -w "$WORK/capture.pcap" tcp 2>"$WORK/tcpdump.err" &
TCPDUMP=$!; PIDS+=("$TCPDUMP")
sleep 1
ip netns exec "${NS[1]}" "$PY" "$LAB/tcp_streams.py" serve --host "${IP[1]}" &
SERVER=$!; PIDS+=("$SERVER")
sleep 1
START=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
ip netns exec "${NS[0]}" "$PY" "$LAB/tcp_streams.py" send --host "${IP[1]}"
wait "$SERVER"
STOP=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
sleep 1
kill -INT "$TCPDUMP"; wait "$TCPDUMP" || true
net_down
"$PY" "$LAB/make_tcp_fixture.py" --work "$WORK" --fixture "$FIXTURE" --start "$START" --stop "$STOP" --loss-permille "$LOSS"
echo "fixture written to $FIXTURE (work files in $WORK)"
