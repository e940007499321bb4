#!/usr/bin/env bash
# Install queueworks with everything its tests and demo use, on a fresh Debian machine:
# Debian packages when missing (redis-server for private test servers, openssl for TLS
# tests, docker-compose to validate compose.yaml, chromium for the dashboard's browser
# tests) and the Python package with its dev, dashboard and torch (CPU) extras.
set -euo pipefail
cd "$(dirname "$0")"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v openssl >/dev/null || need+=(openssl)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "install.sh: please install ${need[*]} (Debian packages) and run again" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python3 -m pip install -q -e '.[dev,dashboard,torch]'
