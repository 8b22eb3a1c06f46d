#!/bin/sh
# Real `ip`, `ifconfig`, `ethtool`, `dmesg` and `journalctl -k` output for tracelens' host-evidence
# tests: two network namespaces joined by a veth pair, an MTU mismatch (9000 vs 1500),
# then one end taken down and up again. Run as root; writes into OUT (default: ./out).
# It cleans up its namespaces on exit. Nothing here is edited afterwards.
set -eu
OUT=${1:-out}
mkdir -p "$OUT"
A=tlhost-a B=tlhost-b
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $A
ip netns add $B
ip link add vh-a type veth peer name vh-b
ip link set vh-a netns $A
ip link set vh-b netns $B
ip -n $A addr add 10.77.0.1/24 dev vh-a
ip -n $B addr add 10.77.0.2/24 dev vh-b
ip -n $A link set lo up
ip -n $B link set lo up
ip -n $A link set vh-a up
ip -n $B link set vh-b up
# jumbo frames on one end only: the MTU mismatch the rule must find
ip -n $A link set vh-a mtu 9000
# (no ping on this machine: the addresses are configured, no traffic is needed for these listings)
start=$(date -u "+%Y-%m-%d %H:%M:%S")
for ns in $A $B; do
  { date -u; hostname_line="host: $ns"; echo "$hostname_line"; ip -n $ns link; } > "$OUT/$ns-ip-link.txt"
  { date -u; echo "host: $ns"; ip -n $ns -d link; } > "$OUT/$ns-ip-d-link.txt"
  { date -u; echo "host: $ns"; ip -n $ns -s link; } > "$OUT/$ns-ip-s-link.txt"
  { date -u; echo "host: $ns"; ip -n $ns addr; } > "$OUT/$ns-ip-addr.txt"
  { date -u; echo "host: $ns"; ip netns exec $ns ifconfig -a; } > "$OUT/$ns-ifconfig.txt"
done
# ethtool on each end: statistics (-S), link settings, driver
for pair in "$A vh-a" "$B vh-b"; do
  set -- $pair
  { date -u; echo "host: $1"; echo "\$ ethtool -S $2"; ip netns exec $1 ethtool -S $2; } > "$OUT/$1-ethtool-S.txt"
  { date -u; echo "host: $1"; ip netns exec $1 ethtool $2; ip netns exec $1 ethtool -i $2; } > "$OUT/$1-ethtool.txt"
done
# a link flap: B's end down for 2 s, then up again
ip -n $B link set vh-b down
sleep 2
ip -n $B link set vh-b up
sleep 1
{ date -u; echo "host: $B"; ip -n $B -s -s link show vh-b; } > "$OUT/$B-ip-s-s-link-after-flap.txt"
dmesg --time-format iso | tail -n 40 > "$OUT/dmesg-iso.txt"
dmesg -T | tail -n 40 > "$OUT/dmesg-T.txt"
dmesg | tail -n 40 > "$OUT/dmesg-raw.txt"
journalctl -k --utc --since "$start UTC" --no-pager > "$OUT/journalctl-k.txt" 2>&1 || true
journalctl -k -o short-iso --utc -n 30 --no-pager > "$OUT/journalctl-k-short-iso.txt" 2>&1 || true
echo "made $(ls "$OUT" | wc -l) files in $OUT from $start UTC"
