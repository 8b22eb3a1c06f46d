#!/usr/bin/env bash
# Run one lab scenario for real and write it as a fixture: lab/run.sh SCENARIO [FIXTURE_DIR]
#
# Two ranks, each in its own network namespace (10.99.0.1 and 10.99.0.2 on a veth pair),
# each pinned to one CPU, train a small MLP with DeepSpeed ZeRO-2 over gloo on CPU.
# tcpdump -s 96 records the link from the first namespace. One impairment is switched on
# IMPAIR_AFTER seconds after the first logged step (not after launch: DeepSpeed may compile
# its CPU comm op first) and off IMPAIR_FOR seconds later; its UTC times are recorded.
# Needs root, the lab venv (lab/setup.sh) and Debian's nftables, tcpdump and faketime.
set -euo pipefail

SCENARIO=${1:?usage: lab/run.sh clean|loss|bandwidth|straggler|straggler-rank0|contention-all|loader-stall|checkpoint|clock-skew|tcp-loss [FIXTURE_DIR]}
LAB=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$LAB")
FIXTURE=${2:-$REPO/fixtures/lab-$SCENARIO}
PY=${LAB_PYTHON:-$LAB/.venv/bin/python}   # lab/setup.sh's venv by default
RUN_S=${RUN_S:-120}            # training time from the first step
IMPAIR_AFTER=${IMPAIR_AFTER:-45}
case $SCENARIO in straggler*|contention-all) DEFAULT_FOR=45 ;; *) DEFAULT_FOR=40 ;; esac
IMPAIR_FOR=${IMPAIR_FOR:-$DEFAULT_FOR}
LOSS_PCT=${LOSS_PCT:-4}
RATE=${RATE:-2 mbytes/second}
HOGS=${HOGS:-3}                # busy loops per contended CPU
SKEW=${SKEW:-+2.5s}
WORK=$(mktemp -d -t tracelens-lab.XXXXXX)
NS=(tl-lab-a tl-lab-b)
DEV=(tl-veth-a tl-veth-b)
IP=(10.99.0.1 10.99.0.2)
PIDS=()

source "$LAB/net.sh"

now() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }
note() { echo "$(now) $*" | tee -a "$WORK/events.log" >&2; }

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    net_down
}
trap cleanup EXIT
trap "exit 130" INT TERM

hog_cpu() {  # hog_cpu CPU: HOGS busy loops on that CPU, at the ranks' own priority
    for _ in $(seq "$HOGS"); do
        taskset -c "$1" nice -n -10 sh -c 'while :; do :; done' &
        HOG_PIDS+=("$!"); PIDS+=("$!")
    done
}

impair_on() {
    case "$SCENARIO" in
        loss|clock-skew) nft_loss "${NS[1]}" "${DEV[1]}" "$LOSS_PCT" ;;
        bandwidth) nft_rate "${NS[1]}" "${DEV[1]}" "$RATE" ;;
        straggler) HOG_PIDS=(); hog_cpu 1 ;;
        straggler-rank0) HOG_PIDS=(); hog_cpu 0 ;;
        contention-all) HOG_PIDS=(); hog_cpu 0; hog_cpu 1 ;;
        loader-stall) touch "$WORK/flags/stall" ;;
        checkpoint) touch "$WORK/flags/checkpoint" ;;
    esac
}

impair_off() {
    case "$SCENARIO" in
        loss|clock-skew|bandwidth) nft_clear "${NS[1]}" ;;
        straggler*|contention-all) for pid in "${HOG_PIDS[@]}"; do kill "$pid"; done ;;
        loader-stall) rm -f "$WORK/flags/stall" ;;
    esac
}

start_rank() {  # start_rank RANK
    local r=$1 host=${IP[$1]} pre=()
    mkdir -p "$WORK/logs/$host"
    if [[ $SCENARIO == clock-skew && $r == 1 ]]; then
        pre=(env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 FAKETIME="$SKEW" FAKETIME_DONT_RESET=1)
    fi
    ip netns exec "${NS[$r]}" taskset -c "$r" nice -n -10 "${pre[@]}" env \
        RANK="$r" LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR="${IP[0]}" MASTER_PORT=29511 \
        GLOO_SOCKET_IFNAME="${DEV[$r]}" DS_ACCELERATOR=cpu DS_BUILD_OPS=0 \
        TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=INFO \
        OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
        "$PY" "$LAB/train.py" --seconds "$RUN_S" --flags "$WORK/flags" --out "$WORK/out$r" \
        >"$WORK/logs/$host/rank$r.log" 2>&1 &
    RANK_PIDS+=("$!"); PIDS+=("$!")
}

first_step() {  # wait until both ranks logged a step
    for _ in $(seq 1200); do
        if grep -q 'step=1,' "$WORK/logs/${IP[0]}/rank0.log" "$WORK/logs/${IP[1]}/rank1.log" 2>/dev/null &&
           [[ $(grep -l 'step=1,' "$WORK/logs"/*/rank*.log | wc -l) == 2 ]]; then return 0; fi
        sleep 0.5
    done
    echo "no step logged in 600 s; see $WORK/logs" >&2; return 1
}

if [[ $SCENARIO == tcp-loss ]]; then
    exec "$LAB/tcp_loss.sh" "$FIXTURE"
fi

mkdir -p "$WORK/flags"
net_up
ip netns exec "${NS[0]}" tcpdump -i "${DEV[0]}" -s 96 -U -w "$WORK/capture.pcap" tcp 2>"$WORK/tcpdump.err" &
TCPDUMP=$!; PIDS+=("$TCPDUMP")
sleep 1
note "launch $SCENARIO"
RANK_PIDS=()
start_rank 0; start_rank 1
first_step
note "first step"
sleep "$IMPAIR_AFTER"
note "impairment on"
START=$(now)
impair_on
if [[ $SCENARIO == checkpoint ]]; then
    for _ in $(seq 600); do [[ -f $WORK/out0/pause.json ]] && break; sleep 0.5; done
    STOP=$(now)
    rm -f "$WORK/flags/checkpoint"
else
    sleep "$IMPAIR_FOR"
    impair_off
    STOP=$(now)
fi
note "impairment off"
for pid in "${RANK_PIDS[@]}"; do wait "$pid"; done
note "ranks done"
sleep 1
kill -INT "$TCPDUMP"; wait "$TCPDUMP" || true
net_down
"$PY" "$LAB/make_fixture.py" --scenario "$SCENARIO" --work "$WORK" --fixture "$FIXTURE" \
    --start "$START" --stop "$STOP" --loss-pct "$LOSS_PCT" --rate "$RATE" --hogs "$HOGS" --skew "$SKEW" \
    --impair-after "$IMPAIR_AFTER"
echo "fixture written to $FIXTURE (work files in $WORK)"
