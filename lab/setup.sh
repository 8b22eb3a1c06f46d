#!/usr/bin/env bash
# The lab's own environment, outside the package and CI: Debian's tools and a venv with torch
# (the local CPU build) and DeepSpeed. Run once as root: lab/setup.sh [VENV]
# VENV defaults to $LAB_VENV, else lab/.venv (the python the lab scripts use unless LAB_PYTHON says otherwise).
set -euo pipefail
VENV=${1:-${LAB_VENV:-$(cd "$(dirname "$0")" && pwd)/.venv}}
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 nftables tcpdump tshark faketime ethtool
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0   # the local CPU build; plain `torch` would fetch a CUDA build
"$VENV/bin/pip" install -q deepspeed py-spy
"$VENV/bin/python" -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__)'
