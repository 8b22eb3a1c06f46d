# Sourced by run.sh and tcp_loss.sh: two network namespaces on a veth pair, and the nftables
# impairments on the second one. Uses the caller's NS, DEV and IP arrays.

net_up() {
    net_down
    ip netns add "${NS[0]}"; ip netns add "${NS[1]}"
    ip link add "${DEV[0]}" netns "${NS[0]}" type veth peer name "${DEV[1]}" netns "${NS[1]}"
    local i
    for i in 0 1; do
        ip -n "${NS[$i]}" addr add "${IP[$i]}/24" dev "${DEV[$i]}"
        ip -n "${NS[$i]}" link set lo up
        ip -n "${NS[$i]}" link set "${DEV[$i]}" up
        # Receive processing on the rank's own CPU: without it the one gloo connection is
        # reordered across the two CPUs and TCP retransmits spuriously with no loss at all.
        ip netns exec "${NS[$i]}" sh -c "echo $((1 << i)) > /sys/class/net/${DEV[$i]}/queues/rx-0/rps_cpus"
    done
}

net_down() {
    local ns
    for ns in "${NS[@]}"; do
        ip netns exec "$ns" nft delete table inet tl_lab 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}

nft_table() {  # nft_table NS DEV RULE: RULE on every packet in and out of DEV
    ip netns exec "$1" nft -f - <<NFT
table inet tl_lab {
    chain in { type filter hook input priority 0; policy accept; iifname "$2" $3; }
    chain out { type filter hook output priority 0; policy accept; oifname "$2" $3; }
}
NFT
}

nft_loss() { nft_table "$1" "$2" "numgen random mod 100 < $3 drop"; }       # nft_loss NS DEV PERCENT
nft_loss_in() {  # nft_loss_in NS DEV PERCENT: only what DEV receives
    ip netns exec "$1" nft -f - <<NFT
table inet tl_lab {
    chain in { type filter hook input priority 0; policy accept; iifname "$2" numgen random mod 100 < $3 drop; }
}
NFT
}
nft_rate() { nft_table "$1" "$2" "meta l4proto tcp limit rate over $3 burst 128 kbytes drop"; }  # nft_rate NS DEV "600 kbytes/second"
nft_clear() { ip netns exec "$1" nft delete table inet tl_lab; }
