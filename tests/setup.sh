#!/usr/bin/env bash
# Installs what flock's tests and quickstart need on Debian (idempotent; apt-get update only
# when something is missing). Run as root.
set -euo pipefail
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
# tests/kernel_host.rs forges neighbour solicitations with a raw socket from Python.
command -v python3 >/dev/null 2>&1 || need+=(python3)
# tests/deploy.rs splits a binary's debug info as the image build does (deploy/split-debuginfo.sh).
command -v objcopy >/dev/null 2>&1 || need+=(binutils)
[ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
# tests/lint-deploy.sh makes a virtual environment; Debian's Python needs python3-venv for it.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && ! /usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "tests/setup.sh: missing ${need[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "tests/setup.sh: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
